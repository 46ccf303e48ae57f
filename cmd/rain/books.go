package main

// This file is the system of record of `rain serve`: --postgres, and the
// in-process settlement of an embedded run.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"rain/internal/instance"
	"rain/internal/ledger"
	"rain/internal/postgres"
)

// books opens --postgres as the system of record closes reconcile with,
// and, on embedded shards, the in-process settle worker's sink: that
// database, or a ledger file in a temporary directory, named in the log.
func (s *server) books(ctx context.Context, icfg *instance.Config) error {
	c, log := s.cfg, s.log
	if c.Postgres != "" {
		if err := checkPostgresTLS(c.Postgres, s.warn); err != nil {
			return err
		}
		db, err := postgres.Open(ctx, c.Postgres)
		if err != nil {
			return fmt.Errorf("--postgres: %w", err)
		}
		s.release = append(s.release, db.Close)
		icfg.Books = db
		log.Info("system of record", "postgres", redactURL(c.Postgres))
		if c.tryIt() {
			icfg.Settle = db
		}
	}
	if !c.tryIt() {
		return nil
	}
	if icfg.Settle == nil {
		dir, err := os.MkdirTemp("", "rain-ledger-")
		if err != nil {
			return err
		}
		path := filepath.Join(dir, "ledger.jsonl")
		l, err := ledger.Open(path)
		if err != nil {
			return err
		}
		s.release = append(s.release, func() { l.Close() })
		icfg.Settle = l
		log.Info("settling in process into a ledger file (kept after exit)", "ledger", path)
	}
	return nil
}
