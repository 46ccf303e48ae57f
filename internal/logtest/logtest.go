// Package logtest holds the log of a process or a server that a test reads
// while it is still being written.
package logtest

import (
	"strings"
	"sync"
)

// Buffer is a log safe for its writers and a reader at once. The zero
// value is empty and ready.
type Buffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
