package api

// This file keeps every answer JSON (API.md) where net/http's own code
// answers: ServeMux's redirects of a path that is not clean (//healthz,
// /admin/x/../y, /admin to /admin/), its 400 to OPTIONS *, its 405 to a
// CONNECT, http.Error and http.NotFound in the handlers of the side
// listeners (pprof's, rain settle's health listener).

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// jsonOnly is a ResponseWriter that turns an answer written as anything
// but JSON into JSON when it is a redirect (its Location kept, named in
// the body) or a refusal (4xx, 5xx: its text becomes the error), the
// status kept. Other answers (the dashboard's files, /metrics, profiles)
// pass through. finish writes the JSON once the handler has returned.
type jsonOnly struct {
	http.ResponseWriter
	code   int          // the status written; 0 before
	held   bool         // the answer is being turned into JSON
	reason bytes.Buffer // the handler's text of a refusal (its first 512 bytes)
}

func (w *jsonOnly) WriteHeader(code int) {
	if code < 200 {
		w.ResponseWriter.WriteHeader(code) // informational: the answer is still to come
		return
	}
	if w.code != 0 {
		return // superfluous, as net/http has it
	}
	w.code = code
	isRedirect := code == http.StatusMovedPermanently || code == http.StatusFound || code == http.StatusSeeOther ||
		code == http.StatusTemporaryRedirect || code == http.StatusPermanentRedirect
	if (isRedirect || code >= 400) && !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
		w.held = true
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *jsonOnly) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.held {
		if room := 512 - w.reason.Len(); room > 0 {
			w.reason.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *jsonOnly) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish writes the JSON answer held, if any.
func (w *jsonOnly) finish() {
	if !w.held {
		return
	}
	h := w.Header()
	body := map[string]string{}
	if w.code < 400 {
		body["location"] = h.Get("Location")
	} else {
		body["status"] = "invalid"
		switch {
		case w.code == http.StatusNotFound:
			body["status"] = "not_found"
		case w.code >= 500:
			body["status"] = "error"
		}
		reason := strings.TrimSpace(w.reason.String())
		if reason == "" || strings.HasPrefix(reason, "<") {
			reason = http.StatusText(w.code)
		}
		body["error"] = reason
	}
	h.Del("Content-Length")
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.ResponseWriter.WriteHeader(w.code)
	_ = json.NewEncoder(w.ResponseWriter).Encode(body)
}
