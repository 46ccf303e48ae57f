package main

// This file is what the commands read of secrets: the CA of TLS shards,
// the user-auth and admin-token options of rain serve, and their reload on
// SIGHUP.

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"rain/internal/auth"
)

// redisCAFlag adds --redis-ca.
func redisCAFlag(f *flags, v *string) {
	f.StringVar(v, "redis-ca", "", "PEM file of the CA that signed the certificates of rediss:// shards (default: the system's roots)")
	f.bindEnv("redis-ca", "RAIN_REDIS_CA")
}

// redisTLS is the TLS configuration of rediss:// shards: the CA of caFile,
// or the system's roots when it is empty.
func redisTLS(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	b, err := auth.ReadKeyFile(caFile)
	if err != nil {
		return nil, usagef("--redis-ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		return nil, usagef("--redis-ca %s: no PEM certificate in it", caFile)
	}
	cfg.RootCAs = roots
	return cfg, nil
}

// warnReadable warns when every user of the host may read the secret file
// that flag names ("" names none): the secret is theirs too.
func warnReadable(log *slog.Logger, flag, path string) {
	if path != "" && auth.WorldReadable(path) {
		log.Warn("a secret file that every user of the host may read: chmod o-r it (600, or 640 with the group rain runs as)", "flag", flag, "file", path)
	}
}

// reloader is something SIGHUP reloads.
type reloader struct {
	name   string
	reload func() error
}

// reloadOnHUP reloads each of rs on SIGHUP until stop is called, logging
// what happened (a failed reload's error says what stays in use: the user
// keys loaded before; of the admin token file, only the tokens it still
// lists). The signal is watched when it returns; stop waits for the
// watcher to end.
func reloadOnHUP(log *slog.Logger, rs ...reloader) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		defer signal.Stop(hup)
		for {
			select {
			case <-done:
				return
			case <-hup:
				for _, r := range rs {
					if err := r.reload(); err != nil {
						log.Error("SIGHUP: reload failed", "what", r.name, "err", err)
					} else {
						log.Info("SIGHUP: reloaded", "what", r.name)
					}
				}
			}
		}
	}()
	return func() { close(done); <-ended }
}
