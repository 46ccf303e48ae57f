// Package deploy holds no code: it is the deployment of rain (the
// Kubernetes manifests in k8s/ and their overlay for a Redis Cluster in
// k8s-cluster/, Prometheus's rules and configuration in prometheus/,
// Alertmanager's in alertmanager/, the Grafana dashboard in grafana/) and,
// in its tests, the checks that keep those files and docker-compose.yml,
// the Dockerfile and .dockerignore at the repository's root in step with
// the binary they run. docs/operations.md tells how to deploy rain.
package deploy
