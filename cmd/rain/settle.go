package main

// This file is `rain settle`: the settlement worker and its health server.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"rain/internal/api"
	"rain/internal/auth"
	"rain/internal/ledger"
	"rain/internal/metrics"
	"rain/internal/postgres"
	"rain/internal/settle"
	"rain/internal/shard"
	"rain/internal/webhook"
)

func settleCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, tc := toolFlags("settle", stderr)
	var cfg settle.Config
	var ledger, webhook, webhookSecretFile, pg string
	var webhookHTTP bool
	f.StringVar(&pg, "postgres", "", "deliver settled grants into this PostgreSQL database (postgres://...): the system of record; any number of workers may share it")
	f.StringVar(&ledger, "ledger", "", "append settled grants to this JSON-lines file (one line per serial, fsynced)")
	f.StringVar(&webhook, "webhook", "", "POST settled grants to this wallet URL, https:// (the wallet pays each serial of the signed body once; Idempotency-Key: the serial); redirects are not followed")
	f.BoolVar(&webhookHTTP, "webhook-allow-http", false, "let --webhook be an http:// URL: grants, their signature and the wallet's answers in clear on the network (tests, or a wallet on this host only)")
	f.StringVar(&webhookSecretFile, "webhook-secret-file", "", "file holding the secret that signs every webhook delivery (header Rain-Signature: t=<unix>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">); empty: unsigned")
	f.StringVar(&cfg.Group, "group", "settle", "consumer group on the outbox streams")
	f.StringVar(&cfg.Consumer, "consumer", "", "this worker's consumer name, unique per process (default hostname-pid)")
	f.DurationVar(&cfg.ClaimAfter, "claim-after", 30*time.Second, "take over entries pending this long on a dead consumer")
	logOpts := f.logFlags()
	var durability string
	durabilityFlag(f, &durability)
	var listen string
	f.StringVar(&listen, "listen", "", "serve GET /healthz and GET /metrics on this address (empty: none)")
	f.bindEnv("listen", "RAIN_SETTLE_LISTEN")
	f.bindEnv("ledger", "RAIN_LEDGER")
	f.bindEnv("postgres", "RAIN_POSTGRES")
	f.bindEnv("webhook", "RAIN_WEBHOOK")
	f.bindEnv("webhook-secret-file", "RAIN_WEBHOOK_SECRET_FILE")
	f.bindEnv("webhook-allow-http", "RAIN_WEBHOOK_ALLOW_HTTP")
	f.bindEnv("group", "RAIN_SETTLE_GROUP")
	f.bindEnv("consumer", "RAIN_SETTLE_CONSUMER")
	f.bindEnv("claim-after", "RAIN_CLAIM_AFTER")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	log, err := logOpts.newLogger(stderr)
	if err != nil {
		return err
	}
	cfg.Logger = log
	log.Info("rain settle", versionAttrs()...)
	for _, w := range f.secretArgs(nil, "redis", "postgres", "webhook") {
		log.Warn(w)
	}
	sink, closeSink, err := settleSink(ctx, sinkFlags{ledger, webhook, webhookSecretFile, pg, webhookHTTP}, log)
	if err != nil {
		return err
	}
	defer closeSink()
	set, cat, err := openTool(tc, nil)
	if err != nil {
		return err
	}
	defer set.Close()
	// A confirm must be on disk before the payout: settle refuses shards
	// that could lose it, as serve does.
	relaxed, unreached, err := checkDurability(ctx, set, durability, log)
	if err != nil {
		return err
	}
	held := newHeld(unreached, relaxed)
	if durability == "strict" {
		cfg.Held = held.has // nothing confirmed there until checkLater has read it
	}
	cfg.Logger.Info("settling", "shards", len(set.Names()), "group", cfg.Group, "ledger", ledger, "webhook", redactURL(webhook), "postgres", redactURL(pg))
	w := settle.New(set, cat, sink, cfg)
	if listen != "" {
		reg := metrics.New(buildInfo())
		reg.Settle(w.Stats)
		reg.Durability(held.isRelaxed)
		stop, err := serveHealth(listen, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	// A cluster shard's primaries are read again every 10 s: a replica
	// promoted or added is known, and confirms there wait for its replica.
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		set.WatchClusters(wctx, 10*time.Second, func(c shard.ClusterChange) {
			log.Warn("the primaries of a cluster shard changed", "shard", c.Shard, "added", c.Added, "removed", c.Removed, "primaries", c.Primaries)
		})
	}()
	// A shard that did not answer at start is checked once it does; one
	// that could lose a confirm stops settlement (checkLater).
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var late error
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		if late = checkLater(rctx, set, unreached, durability, time.Second, log, held); late != nil {
			stopRun()
		}
	}()
	w.Run(rctx)
	stopRun()
	<-checked
	stopWatch()
	<-watched
	return late
}

// sinkFlags are the flags that name rain settle's sink.
type sinkFlags struct {
	ledger, webhook, secretFile, postgres string
	webhookHTTP                           bool // --webhook-allow-http
}

// settleSink is the sink --postgres, --ledger or --webhook names (exactly
// one of them); closeSink closes it.
func settleSink(ctx context.Context, sf sinkFlags, log *slog.Logger) (sink settle.Sink, closeSink func(), err error) {
	ledgerPath, webhookURL, secretFile := sf.ledger, sf.webhook, sf.secretFile
	given := 0
	for _, v := range []string{sf.postgres, ledgerPath, webhookURL} {
		if v != "" {
			given++
		}
	}
	switch {
	case given != 1:
		return nil, nil, usagef("give exactly one of --postgres, --ledger and --webhook")
	case sf.postgres != "":
		if err := checkPostgresTLS(sf.postgres, func(w string) { log.Warn(w) }); err != nil {
			return nil, nil, err
		}
		db, err := postgres.Open(ctx, sf.postgres)
		if err != nil {
			return nil, nil, fmt.Errorf("--postgres: %w", err)
		}
		return db, db.Close, nil
	case ledgerPath != "":
		l, err := ledger.Open(ledgerPath)
		if err != nil {
			return nil, nil, err
		}
		return l, func() { l.Close() }, nil
	}
	u, err := url.Parse(webhookURL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, nil, usagef("--webhook %s: want an https:// URL", redactURL(webhookURL))
	case u.Scheme == "http" && !sf.webhookHTTP:
		return nil, nil, usagef("--webhook %s: an http:// URL sends every grant and its signature in clear, and lets anyone on the path answer for the wallet: want https://, or --webhook-allow-http", redactURL(webhookURL))
	case u.Scheme == "http":
		log.Warn("webhook over plain http (--webhook-allow-http): grants and the wallet's answers in clear on the network", "webhook", redactURL(webhookURL))
	}
	wh := &webhook.Wallet{URL: webhookURL}
	if secretFile == "" {
		log.Warn("webhook deliveries are not signed: give --webhook-secret-file so the wallet can tell rain's deliveries from forged ones")
		return wh, func() {}, nil
	}
	b, err := auth.ReadKeyFile(secretFile)
	if err != nil {
		return nil, nil, usagef("--webhook-secret-file: %w", err)
	}
	warnReadable(log, "--webhook-secret-file", secretFile)
	if wh.Secret = []byte(strings.TrimSpace(string(b))); len(wh.Secret) < auth.MinSecret {
		return nil, nil, usagef("--webhook-secret-file %s: a secret of %d bytes; want at least %d", secretFile, len(wh.Secret), auth.MinSecret)
	}
	return wh, func() {}, nil
}

// redactURL is u with its password masked, for logs; "" stays "". A
// query is masked too, but for sslmode (a wallet's key may ride in a
// webhook's query; a database URL's sslmode says how it is reached).
func redactURL(u string) string {
	if u == "" {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil {
		return "(not shown: not a URL)"
	}
	if p.RawQuery != "" {
		q := url.Values{}
		for k, v := range p.Query() {
			if k == "sslmode" {
				q[k] = v
			} else {
				q.Set(k, "xxxxx")
			}
		}
		p.RawQuery = q.Encode()
	}
	return p.Redacted()
}

// serveHealth serves GET /healthz and GET /metrics on addr in the
// background, and logs the address it serves on (port 0 picks one); stop
// shuts it down.
func serveHealth(addr string, reg *metrics.Registry, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	log.Info("serving", "addr", ln.Addr().String())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("GET /metrics", reg.Handler())
	return api.ServeApart(ln, mux, api.WriteTimeout, healthIdleTimeout, log), nil
}
