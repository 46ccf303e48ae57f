package grab

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// alarm wakes a lane at a time to the microsecond: a timerfd read through
// the runtime's netpoller. A Go timer of under a millisecond does not keep
// its time in a process whose processors are idle: the netpoller then
// sleeps in whole milliseconds (epoll_wait), and the timer fires at the
// process's next wake-up of any kind, up to a millisecond late. A lane's
// linger of lingerMax lasted about that long in an open loop on one shard
// (BenchmarkOpenLoop), and every claim waited for it. A timerfd's expiry
// is an event epoll_wait returns for, so the alarm rings on time without
// a thread that sleeps or spins for it.
type alarm struct {
	fd   int
	f    *os.File
	ring chan struct{} // one send per expiry, after set
	stop chan struct{} // closed by close
	done chan struct{} // closed when run returns
}

// newAlarm returns a lane's alarm, or nil when the system has none to give
// (the lane then keeps to Go's timers); close it when the lane ends.
func newAlarm() *alarm {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	a := &alarm{fd: fd, f: os.NewFile(uintptr(fd), "lane-alarm"), ring: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a
}

// set has the alarm ring once, d from now, or never for d 0 (an expiry set
// before and not yet rung is dropped: the timer restarts).
func (a *alarm) set(d time.Duration) {
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	_ = unix.TimerfdSettime(a.fd, 0, &its, nil)
}

// run rings once per expiry until the alarm is closed. A ring waits for the
// lane to take it: a lane that ended its linger before the alarm takes the
// ring at its next linger, and knows it for an old one by the time.
func (a *alarm) run() {
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

// close stops the alarm and waits for run to return.
func (a *alarm) close() {
	close(a.stop)
	_ = a.f.Close()
	<-a.done
}
