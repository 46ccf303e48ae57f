//go:build !linux

package alarm

import "time"

// Alarm: see alarm_linux.go. Elsewhere there is none: New returns nil.
type Alarm struct{}

// New returns nil: no alarm here; keep to Go's timers.
func New() *Alarm { return nil }

// Set does nothing.
func (a *Alarm) Set(time.Duration) {}

// C is nil.
func (a *Alarm) C() <-chan struct{} { return nil }

// Close does nothing.
func (a *Alarm) Close() {}
