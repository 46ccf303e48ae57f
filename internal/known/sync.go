package known

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/events"
)

// SyncConfig tunes a Sync. Zero fields take the documented defaults.
type SyncConfig struct {
	// Refresh is how often the registries are listed again. Default 2s:
	// preload notices tell every instance at once; the refresh only bounds
	// what a lost notice costs, and costs the serial shard one call per
	// instance each time.
	Refresh time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Sync keeps a Filter current: it Resets it from the pool registries at the
// start and every Refresh. Preload notices (internal/events) Add a pool at
// once where the owner of the filter listens for them; the refresh bounds
// what a lost notice costs to about Refresh.
type Sync struct {
	filter *Filter
	list   func(ctx context.Context) ([]string, error)
	cfg    SyncConfig
}

// NewSync returns a Sync that keeps f current; Run starts it. list returns
// every pool id there is (the union of the shards' registries) in a slice f
// may keep. A list that fails may still return the ids it did read (those of
// the shards that answered): they are Added, and nothing is removed.
func NewSync(f *Filter, list func(ctx context.Context) ([]string, error), cfg SyncConfig) *Sync {
	if cfg.Refresh <= 0 {
		cfg.Refresh = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sync{filter: f, list: list, cfg: cfg}
}

// Refresh lists the registries once and Resets the filter from them. On an
// error the filter keeps every id it had, gains whatever ids list returned,
// and the error is returned. Callers may Refresh before serving to know the
// filter is built (until the first Reset it lets every id pass).
func (s *Sync) Refresh(ctx context.Context) error {
	ids, err := s.list(ctx)
	if err != nil {
		for _, id := range ids {
			s.filter.Add(id)
		}
		return fmt.Errorf("list pools: %w", err)
	}
	s.filter.Reset(ids)
	return nil
}

// Run refreshes at once and every Refresh until ctx is done. A failing
// refresh is logged when it starts failing and when it recovers, not every
// second.
func (s *Sync) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Refresh)
	defer t.Stop()
	failing := false
	for {
		err := s.Refresh(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			s.cfg.Logger.Warn("known: refresh failed; keeping the pools known so far", "err", err)
		case err == nil && failing:
			s.cfg.Logger.Info("known: refresh recovered")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Publish tells every instance listening on events.Channel that pool id
// exists, through every client (one per shard). Shards that fail do not
// stop the others; their errors are returned joined. Call it after the
// preload has written the registry, so a refresh never undoes the notice.
func Publish(ctx context.Context, clients []redis.UniversalClient, id string) error {
	return events.Publish(ctx, clients, events.Event{Kind: events.Pool, Pool: id})
}
