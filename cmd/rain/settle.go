package main

// This file is `rain settle`: the settlement worker and its health server.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"rain/internal/metrics"
	"rain/internal/settle"
	"time"
)

func settleCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, tc := toolFlags("settle", stderr)
	var cfg settle.Config
	var ledger, webhook, logLevel string
	f.StringVar(&ledger, "ledger", "", "append settled grants to this JSON-lines file (one line per serial, fsynced)")
	f.StringVar(&webhook, "webhook", "", "POST settled grants to this wallet URL (Idempotency-Key: serial)")
	f.StringVar(&cfg.Group, "group", "settle", "consumer group on the outbox streams")
	f.StringVar(&cfg.Consumer, "consumer", "", "this worker's consumer name, unique per process (default hostname-pid)")
	f.DurationVar(&cfg.ClaimAfter, "claim-after", 30*time.Second, "take over entries pending this long on a dead consumer")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	var durability string
	durabilityFlag(f, &durability)
	var listen string
	f.StringVar(&listen, "listen", "", "serve GET /healthz and GET /metrics on this address (empty: none)")
	f.bindEnv("listen", "RAIN_SETTLE_LISTEN")
	f.bindEnv("ledger", "RAIN_LEDGER")
	f.bindEnv("webhook", "RAIN_WEBHOOK")
	f.bindEnv("group", "RAIN_SETTLE_GROUP")
	f.bindEnv("consumer", "RAIN_SETTLE_CONSUMER")
	f.bindEnv("claim-after", "RAIN_CLAIM_AFTER")
	f.bindEnv("log-level", "RAIN_LOG_LEVEL")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	log, err := newLogger(logLevel, stderr)
	if err != nil {
		return err
	}
	cfg.Logger = log
	var sink settle.Sink
	switch {
	case (ledger == "") == (webhook == ""):
		return errors.New("give exactly one of --ledger and --webhook")
	case ledger != "":
		l, err := settle.OpenLedger(ledger)
		if err != nil {
			return err
		}
		defer l.Close()
		sink = l
	default:
		if u, err := url.Parse(webhook); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--webhook %q: want an http(s) URL", webhook)
		}
		sink = &settle.Webhook{URL: webhook}
	}
	set, svc, err := openTool(tc.Redis, tc.SerialShard)
	if err != nil {
		return err
	}
	defer set.Close()
	defer svc.Close()
	// A confirm must be on disk before the payout: settle refuses shards
	// that could lose it, as serve does.
	relaxed, err := checkDurability(ctx, set, durability, log)
	if err != nil {
		return err
	}
	cfg.Logger.Info("settling", "shards", len(set.Names()), "group", cfg.Group, "ledger", ledger, "webhook", webhook)
	w := settle.New(set, svc, sink, cfg)
	if listen != "" {
		stop, err := serveHealth(listen, func(b []byte) []byte {
			st := w.Stats()
			return metrics.Append(b,
				metrics.Metric{Name: "rain_settle_delivered_total", Kind: "counter", Help: "Grants confirmed and delivered to the sink.", V: st.Delivered},
				metrics.Metric{Name: "rain_settle_expired_total", Kind: "counter", Help: "Outbox grants already released at their deadline: not paid.", V: st.Expired},
				metrics.Metric{Name: "rain_settle_anomalies_total", Kind: "counter", Help: "Outbox entries with no matching grant.", V: st.Anomalies},
				metrics.Metric{Name: "rain_settle_failures_total", Kind: "counter", Help: "Failed deliveries (retried).", V: st.Failures},
				metrics.Metric{Name: "rain_settle_conflicts_total", Kind: "counter", Help: "Outbox entries whose serial the sink had paid for another grant: left pending for an operator.", V: st.Conflicts},
				metrics.Metric{Name: "rain_durability_relaxed", Kind: "gauge", Help: "1 when rain runs with --durability relaxed on shards that can lose acknowledged grants.", V: boolMetric(relaxed)},
			)
		})
		if err != nil {
			return err
		}
		defer stop()
	}
	return w.Run(ctx)
}

// serveHealth serves GET /healthz and GET /metrics on addr in the
// background; stop shuts it down.
func serveHealth(addr string, appendMetrics func([]byte) []byte) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(appendMetrics(nil))
	})
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
