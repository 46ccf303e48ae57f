package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"rain/loadtest/rainload/internal/hist"
)

// Summary is what a run measured, written by -summary as JSON. Its field names are
// stable; scripts/bench.sh reads them.
//
//	target, pool              the -url and -pool loaded
//	started_at, ended_at      RFC 3339: the schedule's start; when the last request finished
//	schedule_s                seconds of the schedule that ran (less than its length when stopped early)
//	elapsed_s                 started_at to ended_at: schedule_s plus the wait for the last answers
//	stopped_early             Ctrl-C (or SIGTERM) cut the schedule short
//	start_rate, stages        the schedule: stages of {duration_s, target} (a constant -rate is one stage)
//	users, user_prefix, repeat, max_inflight, conns, timeout_s   the load's other flags
//	scheduled                 arrivals due: sent + dropped
//	sent                      requests sent (or that failed trying)
//	answered                  requests with an HTTP answer (every status but "transport")
//	dropped                   arrivals not sent because max_inflight requests were in flight:
//	                          when > 0 the driver did not keep the offered rate
//	offered_rps               scheduled / schedule_s
//	achieved_rps              answered / schedule_s
//	goodput_rps               (granted + already_granted + sold_out + not_found + not_started + ended) / schedule_s
//	shed_rps                  overloaded / schedule_s
//	statuses                  requests by status: the ten of docs/api.md, "error" (5xx other than 503,
//	                          or an answer with no status of docs/api.md) and "transport" (no answer:
//	                          connection error or timeout); every key is present
//	http_codes                answers by HTTP code ("200": n)
//	latency_ms                percentiles in milliseconds, measured from when each request was due:
//	                          "overall" (every finished request), "accepted" (all but overloaded,
//	                          rate_limited and transport), "by_status" (each status with a request); each is
//	                          {count, mean, p50, p90, p99, p999, max}
//	lag_ms                    how late the driver sent requests after they were due (same fields):
//	                          its own share of latency_ms
//	scrape_errors             failed scrapes of /metrics or /admin/pools/{pool} (with -scrape)
//
// Rates divide by schedule_s, so achieved_rps <= offered_rps even though answers
// still arrive after the schedule ends.
type Summary struct {
	Target       string           `json:"target"`
	Pool         string           `json:"pool"`
	StartedAt    time.Time        `json:"started_at"`
	EndedAt      time.Time        `json:"ended_at"`
	ScheduleS    float64          `json:"schedule_s"`
	ElapsedS     float64          `json:"elapsed_s"`
	StoppedEarly bool             `json:"stopped_early"`
	StartRate    float64          `json:"start_rate"`
	Stages       []StageSummary   `json:"stages"`
	Users        int64            `json:"users"`
	UserPrefix   string           `json:"user_prefix"`
	Repeat       float64          `json:"repeat"`
	MaxInflight  int              `json:"max_inflight"`
	Conns        int              `json:"conns"`
	TimeoutS     float64          `json:"timeout_s"`
	Scheduled    int64            `json:"scheduled"`
	Sent         int64            `json:"sent"`
	Answered     int64            `json:"answered"`
	Dropped      int64            `json:"dropped"`
	OfferedRPS   float64          `json:"offered_rps"`
	AchievedRPS  float64          `json:"achieved_rps"`
	GoodputRPS   float64          `json:"goodput_rps"`
	ShedRPS      float64          `json:"shed_rps"`
	Statuses     map[string]int64 `json:"statuses"`
	HTTPCodes    map[string]int64 `json:"http_codes"`
	Latency      Latencies        `json:"latency_ms"`
	Lag          Percentiles      `json:"lag_ms"`
	ScrapeErrors int64            `json:"scrape_errors"`
}

// StageSummary is one stage of the schedule.
type StageSummary struct {
	DurationS float64 `json:"duration_s"`
	Target    float64 `json:"target"`
}

// Latencies are the latency percentiles of a run.
type Latencies struct {
	Overall  Percentiles            `json:"overall"`
	Accepted Percentiles            `json:"accepted"`
	ByStatus map[string]Percentiles `json:"by_status"`
}

// Percentiles summarize a histogram, in milliseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

func percentiles(h *hist.Hist) Percentiles {
	return Percentiles{
		Count: int64(h.Count()), Mean: ms(h.Mean()),
		P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max()),
	}
}

// summary builds the Summary of a finished run: sched is how long the schedule
// ran, end when the last request finished (both since start).
func (d *driver) summary(sched, end time.Duration, early bool, scrapeErrs int64) *Summary {
	cfg := d.cfg
	s := &Summary{
		Target: cfg.base.String(), Pool: cfg.pool,
		StartedAt: d.start.UTC(), EndedAt: d.start.Add(end).UTC(),
		ScheduleS: sched.Seconds(), ElapsedS: end.Seconds(), StoppedEarly: early,
		StartRate: cfg.startRate,
		Users:     cfg.users, UserPrefix: cfg.userPrefix, Repeat: cfg.repeat,
		MaxInflight: cfg.maxInflight, Conns: cfg.conns, TimeoutS: cfg.timeout.Seconds(),
		Scheduled: d.offered.Load(), Dropped: d.dropped.Load(),
		Statuses: map[string]int64{}, HTTPCodes: map[string]int64{},
		Latency:      Latencies{ByStatus: map[string]Percentiles{}},
		Lag:          percentiles(&d.lag),
		ScrapeErrors: scrapeErrs,
	}
	for _, st := range cfg.stages {
		s.Stages = append(s.Stages, StageSummary{DurationS: st.Duration.Seconds(), Target: st.Target})
	}
	var overall, accepted hist.Hist
	var goodput int64
	for st := range nStatus {
		h := &d.latency[st]
		n := int64(h.Count())
		s.Statuses[statusNames[st]] = n
		s.Sent += n
		if st != transport {
			s.Answered += n
		}
		if st.goodput() {
			goodput += n
		}
		if n > 0 {
			s.Latency.ByStatus[statusNames[st]] = percentiles(h)
		}
		overall.Merge(h)
		if st.accepted() {
			accepted.Merge(h)
		}
	}
	s.Latency.Overall, s.Latency.Accepted = percentiles(&overall), percentiles(&accepted)
	for code := range d.codes {
		if n := d.codes[code].Load(); n > 0 {
			s.HTTPCodes[strconv.Itoa(code)] = n
		}
	}
	if secs := sched.Seconds(); secs > 0 {
		s.OfferedRPS = float64(s.Scheduled) / secs
		s.AchievedRPS = float64(s.Answered) / secs
		s.GoodputRPS = float64(goodput) / secs
		s.ShedRPS = float64(s.Statuses["overloaded"]) / secs
	}
	return s
}

// print writes s for a person: rates, counts, and a table of latencies; then one
// line for scripts, "result key=value ...": the counts, the rates, sold_out,
// errors (invalid + unauthorized + error + transport), the accepted latency percentiles, the
// driver's lag, and the p99 latency of shed answers (503 overloaded), as in
// the JSON summary.
func (s *Summary) print(w io.Writer) {
	var stages []string
	for _, st := range s.Stages {
		stages = append(stages, fmt.Sprintf("%gs:%g", st.DurationS, st.Target))
	}
	early := ""
	if s.StoppedEarly {
		early = " (stopped early)"
	}
	fmt.Fprintf(w, "rainload: %s pool %s: %.1fs of schedule from %g/s through %s%s, %.1fs in all\n",
		s.Target, s.Pool, s.ScheduleS, s.StartRate, strings.Join(stages, ","), early, s.ElapsedS)
	fmt.Fprintf(w, "  offered %.1f/s  achieved %.1f/s  goodput %.1f/s  shed %.1f/s  dropped %d of %d\n",
		s.OfferedRPS, s.AchievedRPS, s.GoodputRPS, s.ShedRPS, s.Dropped, s.Scheduled)
	fmt.Fprint(w, "  statuses")
	for st := range nStatus {
		if n := s.Statuses[statusNames[st]]; n > 0 {
			fmt.Fprintf(w, " %s=%d", statusNames[st], n)
		}
	}
	fmt.Fprint(w, "\n  http")
	for code := range 600 {
		if n := s.HTTPCodes[strconv.Itoa(code)]; n > 0 {
			fmt.Fprintf(w, " %d=%d", code, n)
		}
	}
	fmt.Fprintf(w, "\n  %-16s %9s %9s %9s %9s %9s %9s\n", "latency ms", "count", "p50", "p90", "p99", "p99.9", "max")
	row := func(name string, p Percentiles) {
		fmt.Fprintf(w, "  %-16s %9d %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, p.Count, p.P50, p.P90, p.P99, p.P999, p.Max)
	}
	row("accepted", s.Latency.Accepted)
	row("overall", s.Latency.Overall)
	for st := range nStatus {
		if p, ok := s.Latency.ByStatus[statusNames[st]]; ok {
			row("  "+statusNames[st], p)
		}
	}
	row("driver lag", s.Lag)
	if s.ScrapeErrors > 0 {
		fmt.Fprintf(w, "  scrape errors %d\n", s.ScrapeErrors)
	}
	a := s.Latency.Accepted
	fmt.Fprintf(w, "result scheduled=%d sent=%d answered=%d dropped=%d offered_rps=%.1f achieved_rps=%.1f goodput_rps=%.1f shed_rps=%.1f sold_out=%d errors=%d p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f lag_p50_ms=%.3f lag_p99_ms=%.3f shed_p99_ms=%.3f\n",
		s.Scheduled, s.Sent, s.Answered, s.Dropped, s.OfferedRPS, s.AchievedRPS, s.GoodputRPS, s.ShedRPS,
		s.Statuses["sold_out"], s.Statuses["invalid"]+s.Statuses["unauthorized"]+s.Statuses["error"]+s.Statuses["transport"],
		a.P50, a.P90, a.P99, a.P999, a.Max, s.Lag.P50, s.Lag.P99, s.Latency.ByStatus["overloaded"].P99)
}
