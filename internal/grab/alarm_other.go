//go:build !linux

package grab

import "time"

// alarm: see alarm_linux.go. Elsewhere there is none, and the lanes keep
// to Go's timers.
type alarm struct{ ring chan struct{} }

func newAlarm() *alarm             { return nil }
func (a *alarm) set(time.Duration) {}
func (a *alarm) close()            {}
