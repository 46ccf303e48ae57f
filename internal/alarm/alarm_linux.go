// Package alarm wakes a goroutine at a time to the microsecond.
//
// A Go timer of under a millisecond does not keep its time in a process
// whose processors are idle: the runtime's netpoller then sleeps in
// epoll_wait, whose timeout is in whole milliseconds, and the timer fires
// at the process's next wake-up of any kind, up to a millisecond late. An
// Alarm is a timerfd read through the netpoller: its expiry is an event
// epoll_wait returns for, so it rings on time without a thread that sleeps
// or spins for it. rainload times its arrivals with one, and
// internal/grab's BenchmarkOpenLoop its claims.
package alarm

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Alarm rings once per Set, at the time set. One goroutine owns it: Set and
// Close are not safe for concurrent use.
type Alarm struct {
	fd     int
	f      *os.File
	ring   chan struct{} // one send per expiry
	stop   chan struct{} // closed by Close
	done   chan struct{} // closed when run returns
	closed sync.Once
}

// New returns an alarm, or nil when the system has none to give (Linux's
// timerfd); the caller then keeps to Go's timers. Close it when done.
func New() *Alarm {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	a := &Alarm{fd: fd, f: os.NewFile(uintptr(fd), "alarm"), ring: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a
}

// Set has the alarm ring once, d from now, or never for d 0 (an expiry set
// before and not yet rung is dropped: the timer restarts).
func (a *Alarm) Set(d time.Duration) {
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	_ = unix.TimerfdSettime(a.fd, 0, &its, nil)
}

// C is where the alarm rings. A ring waits for its receiver: one not taken
// (its receiver stopped waiting first) comes at the next receive, and the
// receiver knows it for an old one by the time.
func (a *Alarm) C() <-chan struct{} { return a.ring }

// run rings once per expiry until the alarm is closed.
func (a *Alarm) run() {
	defer close(a.done)
	var buf [8]byte
	for {
		if _, err := a.f.Read(buf[:]); err != nil {
			return // closed
		}
		select {
		case a.ring <- struct{}{}:
		case <-a.stop:
			return
		}
	}
}

// Close stops the alarm and waits for it to be stopped. Closing it again
// does nothing.
func (a *Alarm) Close() {
	a.closed.Do(func() {
		close(a.stop)
		_ = a.f.Close()
		<-a.done
	})
}
