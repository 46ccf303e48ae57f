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
	"os"
	"strings"
	"time"

	"rain/internal/auth"
	"rain/internal/metrics"
	"rain/internal/postgres"
	"rain/internal/settle"
)

func settleCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, tc := toolFlags("settle", stderr)
	var cfg settle.Config
	var ledger, webhook, webhookSecretFile, pg string
	f.StringVar(&pg, "postgres", "", "deliver settled grants into this PostgreSQL database (postgres://...): the system of record; any number of workers may share it")
	f.StringVar(&ledger, "ledger", "", "append settled grants to this JSON-lines file (one line per serial, fsynced)")
	f.StringVar(&webhook, "webhook", "", "POST settled grants to this wallet URL (Idempotency-Key: serial)")
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
	sink, closeSink, err := settleSink(ctx, sinkFlags{ledger, webhook, webhookSecretFile, pg}, log)
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
	relaxed, err := checkDurability(ctx, set, durability, log)
	if err != nil {
		return err
	}
	cfg.Logger.Info("settling", "shards", len(set.Names()), "group", cfg.Group, "ledger", ledger, "webhook", webhook, "postgres", redactURL(pg))
	w := settle.New(set, cat, sink, cfg)
	if listen != "" {
		reg := metrics.New(buildInfo())
		reg.Settle(w.Stats)
		reg.Durability(relaxed)
		stop, err := serveHealth(listen, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	w.Run(ctx)
	return nil
}

// sinkFlags are the flags that name rain settle's sink.
type sinkFlags struct{ ledger, webhook, secretFile, postgres string }

// settleSink is the sink --postgres, --ledger or --webhook names (exactly
// one of them); closeSink closes it.
func settleSink(ctx context.Context, sf sinkFlags, log *slog.Logger) (sink settle.Sink, closeSink func(), err error) {
	ledger, webhook, secretFile := sf.ledger, sf.webhook, sf.secretFile
	given := 0
	for _, v := range []string{sf.postgres, ledger, webhook} {
		if v != "" {
			given++
		}
	}
	switch {
	case given != 1:
		return nil, nil, usagef("give exactly one of --postgres, --ledger and --webhook")
	case sf.postgres != "":
		db, err := postgres.Open(ctx, sf.postgres)
		if err != nil {
			return nil, nil, fmt.Errorf("--postgres: %w", err)
		}
		return db, db.Close, nil
	case ledger != "":
		l, err := settle.OpenLedger(ledger)
		if err != nil {
			return nil, nil, err
		}
		return l, func() { l.Close() }, nil
	}
	if u, err := url.Parse(webhook); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, usagef("--webhook %q: want an http(s) URL", webhook)
	}
	wh := &settle.Webhook{URL: webhook}
	if secretFile == "" {
		log.Warn("webhook deliveries are not signed: give --webhook-secret-file so the wallet can tell rain's deliveries from forged ones")
		return wh, func() {}, nil
	}
	b, err := os.ReadFile(secretFile)
	if err != nil {
		return nil, nil, usagef("--webhook-secret-file: %w", err)
	}
	if wh.Secret = []byte(strings.TrimSpace(string(b))); len(wh.Secret) < auth.MinSecret {
		return nil, nil, usagef("--webhook-secret-file %s: a secret of %d bytes; want at least %d", secretFile, len(wh.Secret), auth.MinSecret)
	}
	return wh, func() {}, nil
}

// redactURL is u with its password masked, for logs; "" stays "".
func redactURL(u string) string {
	if u == "" {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil {
		return "(not shown: not a URL)"
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
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.Handle("GET /metrics", reg.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
