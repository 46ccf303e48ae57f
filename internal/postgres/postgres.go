// Package postgres is rain's system of record in PostgreSQL (through pgx):
// the grants settlement delivers (rain_grants), those it settles unpaid
// (rain_unpaid), and the final accounts of closed pools (rain_pools),
// which reports and the wallet side read.
//
// rain owns the schema: numbered migrations embedded in the binary
// (migrations/NNNN_name.sql), applied at Open under an advisory lock, so
// that two workers starting at once apply each once. A DB is a settle.Sink
// (grants in batches, deduplicated by serial across any number of
// workers) and a catalog.Books (what a close reconciles with).
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Errors.
var (
	// ErrAccountConflict is returned by Record when the books hold another
	// account for the pool.
	ErrAccountConflict = errors.New("postgres: another account is recorded for the pool")
)

// migrateLock is the advisory lock key migrations are applied under.
const migrateLock = 0x7261696e // "rain"

// DB is the database. It is safe for concurrent use; Close it once.
type DB struct {
	pool *pgxpool.Pool
}

// Open connects to the database at url (postgres://...) and applies the
// migrations it lacks.
func Open(ctx context.Context, url string) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	db := &DB{pool: pool}
	if err := db.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// Close closes the connections.
func (db *DB) Close() { db.pool.Close() }

// Ping checks the database answers.
func (db *DB) Ping(ctx context.Context) error { return db.pool.Ping(ctx) }

// migrate applies, in order and each in its own transaction, the embedded
// migrations the database has not recorded, under the advisory lock.
func (db *DB) migrate(ctx context.Context) error {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLock); err != nil {
		return fmt.Errorf("postgres: migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLock) // an error: the lock ends with the session
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS rain_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	slices.Sort(files)
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "migrations/"), ".sql")
		n, _, _ := strings.Cut(name, "_")
		version, err := strconv.Atoi(n)
		if err != nil {
			return fmt.Errorf("postgres: migration %s: want NNNN_name.sql", f)
		}
		var applied bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM rain_migrations WHERE version = $1)", version).Scan(&applied); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if applied {
			continue
		}
		sql, err := migrations.ReadFile(f)
		if err != nil {
			return err
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if _, err := tx.Exec(ctx, string(sql)); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("postgres: migration %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO rain_migrations (version, name) VALUES ($1, $2)", version, name); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("postgres: migration %s: %w", name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("postgres: migration %s: %w", name, err)
		}
	}
	return nil
}
