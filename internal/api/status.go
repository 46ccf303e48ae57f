package api

// This file is what a grab can be answered: its statuses and the reasons
// of a 503, each with what it says, as docs/api.md gives them.

import "net/http"

// Grab statuses of docs/api.md, indexed for the metrics.
type status int

const (
	stGranted status = iota
	stAlreadyGranted
	stSoldOut
	stNotFound
	stNotStarted
	stEnded
	stOverloaded
	stInvalid
	stUnauthorized // only with user auth on
	stRateLimited  // only with rate limits on
	stError        // not an API status: a 500, counted apart
	nStatus
)

// statuses are what each status answers: its name in "status" (and in
// the metrics) and its HTTP status code, as docs/api.md gives them.
var statuses = [nStatus]struct {
	name string
	code int
}{
	stGranted:        {"granted", http.StatusOK},
	stAlreadyGranted: {"already_granted", http.StatusOK},
	stSoldOut:        {"sold_out", http.StatusGone},
	stNotFound:       {"not_found", http.StatusNotFound},
	stNotStarted:     {"not_started", http.StatusTooEarly},
	stEnded:          {"ended", http.StatusGone},
	stOverloaded:     {"overloaded", http.StatusServiceUnavailable},
	stInvalid:        {"invalid", http.StatusBadRequest},
	stUnauthorized:   {"unauthorized", http.StatusUnauthorized},
	stRateLimited:    {"rate_limited", http.StatusTooManyRequests},
	stError:          {"error", http.StatusInternalServerError},
}

func (st status) String() string { return statuses[st].name }

// code is the HTTP status code st is answered with.
func (st status) code() int { return statuses[st].code }

// names are the names of the values 0..n-1 of a status or reason, in
// order: the metrics' labels.
func names[T interface {
	~int
	String() string
}](n T) []string {
	out := make([]string, n)
	for v := range n {
		out[v] = v.String()
	}
	return out
}

// Reasons a grab is answered overloaded (503), each counted apart; the
// answer's "error" says which, and whether anything may have been granted.
type reason int

const (
	rsShed        reason = iota // the worker pool is full: refused before any work
	rsUnavailable               // a shard or the serial generator is down: nothing granted
	rsUnknown                   // a step that may grant lost its answer: a retry returns it
	rsBusy                      // the user's own spill is in flight
	rsClientGone                // the client left; the grab may still have run
	rsStopping                  // the instance is shutting down: refused before any work
	rsInternal                  // an error of this instance (a panic): the grab may have run
	nReason
)

// reasons are what each reason answers: its name in the metrics and its
// text in the answer's "error", as docs/api.md gives them.
var reasons = [nReason]struct {
	name, text string
}{
	rsShed:        {"shed", "overloaded: the request was shed; nothing was granted"},
	rsUnavailable: {"shard_unavailable", "a shard is unavailable; nothing was granted"},
	rsUnknown:     {"outcome_unknown", "the outcome is not known yet: the grab may have been granted, and a retry returns it"},
	rsBusy:        {"busy", "a grab of this user is in flight; retry shortly"},
	rsClientGone:  {"client_gone", "the request was cancelled; the grab may have been granted, and a retry returns it"},
	rsStopping:    {"stopping", "this instance is shutting down; nothing was granted"},
	rsInternal:    {"internal", "an internal error: the grab may have been granted, and a retry returns it"},
}

func (rs reason) String() string { return reasons[rs].name }

// text is what the answer's "error" says of rs.
func (rs reason) text() string { return reasons[rs].text }
