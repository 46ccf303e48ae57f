# syntax=docker/dockerfile:1
#
# rain's image: a static binary on a small Alpine, run as a non-root user.
#
#   docker build -t rain --build-arg VERSION=v1.2.3 --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --rm -p 127.0.0.1:8080:8080 -e RAIN_LISTEN=0.0.0.0:8080 rain serve   # embedded shards: trying out only
#
# VERSION and REVISION are stamped into the binary (rain --version, the first
# log line, rain_build_info) and into the image's OCI labels: the build
# context has no .git, so Go cannot read them itself.
#
# The build stage's Go matches go.mod (compose_test.go checks it). Alpine, not
# distroless, for the runtime: its busybox wget is what the compose health
# check calls GET /readyz with (rain has no health subcommand).

FROM --platform=$BUILDPLATFORM golang:1.26-alpine AS build
WORKDIR /src
# Modules first, so that a change to the code does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH
ARG VERSION=devel
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /rain ./cmd/rain

FROM alpine:3.23
ARG VERSION=devel
ARG REVISION=unknown
LABEL org.opencontainers.image.title="rain" \
      org.opencontainers.image.description="rain: the backend of a red-packet rain (POST /grab)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.documentation="README.md and docs/api.md of the source tree"
RUN addgroup -S -g 10001 rain && adduser -S -D -H -u 10001 -G rain -s /sbin/nologin rain \
 && mkdir /ledger && chown 10001:10001 /ledger
# /ledger is where `rain settle` keeps its ledger in docker-compose.yml; a named
# volume mounted there takes this directory's owner, so the non-root user can write.
COPY --from=build /rain /rain
# rain serve listens on 127.0.0.1 unless told otherwise, and the image does
# not tell it otherwise: `docker run -p 8080:8080 rain serve` with no --redis
# is the try-it mode (its admin token in the log, its in-memory shards with
# no password), which must not answer the network unasked. A deployment
# says RAIN_LISTEN=0.0.0.0:8080 (docker-compose.yml and deploy/k8s do).
EXPOSE 8080
# Numeric, so that runtimes enforcing "run as non-root" can verify it.
USER 10001:10001
ENTRYPOINT ["/rain"]
CMD ["serve"]
