package redistest

// This file copies a server's AOF away and back: a shard restored from an
// older AOF, as after a failover that lost writes.

import (
	"os"
	"path/filepath"
)

func (s *Server) aofDir() string { return filepath.Join(s.Dir, "appendonlydir") }

// SnapshotAOF copies the server's AOF directory into a fresh temporary
// directory and returns the copy's path, for RestoreAOF. The server must run
// with AOF on. It waits for an AOF rewrite in progress to finish, so the
// manifest and the files it names agree. The copy holds what Redis has
// written to the files: with Fsync "always" that is every write acknowledged
// so far. Call it while no writes are in flight; a write that lands during
// the copy may be cut short in it (Redis loads such a tail only with
// aof-load-truncated yes, its default, dropping the torn command).
func (s *Server) SnapshotAOF() string {
	s.tb.Helper()
	if !s.opts.AOF {
		s.tb.Fatalf("redistest: SnapshotAOF of %s, which runs without AOF", s.Addr)
	}
	if err := waitAOFIdle(s.Addr); err != nil {
		s.tb.Fatalf("redistest: SnapshotAOF of %s: %v", s.Addr, err)
	}
	dst := filepath.Join(s.tb.TempDir(), "appendonlydir")
	if err := os.CopyFS(dst, os.DirFS(s.aofDir())); err != nil {
		s.tb.Fatalf("redistest: SnapshotAOF of %s: %v", s.Addr, err)
	}
	return dst
}

// RestoreAOF replaces the server's AOF directory with snapshot, a copy made
// by SnapshotAOF, so the next Restart comes back with the older state: a host
// that lost the tail of its AOF. The server must be down (Kill it first).
func (s *Server) RestoreAOF(snapshot string) {
	s.tb.Helper()
	s.mu.Lock()
	up := s.cmd != nil
	s.mu.Unlock()
	if up {
		s.tb.Fatalf("redistest: RestoreAOF of %s while it is running; Kill it first", s.Addr)
	}
	if err := os.RemoveAll(s.aofDir()); err != nil {
		s.tb.Fatalf("redistest: RestoreAOF of %s: %v", s.Addr, err)
	}
	if err := os.CopyFS(s.aofDir(), os.DirFS(snapshot)); err != nil {
		s.tb.Fatalf("redistest: RestoreAOF of %s: %v", s.Addr, err)
	}
}
