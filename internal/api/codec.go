package api

// This file decodes request bodies: the strict decoder, and an
// allocation-free fast path for the common grab body.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"

	"rain"
)

// grabRequest is the POST /grab body.
type grabRequest struct {
	PoolID string `json:"pool_id"`
	UserID string `json:"user_id"`
}

// errBodyTooLarge is returned by decodeGrab for a body over MaxGrabBody.
var errBodyTooLarge = fmt.Errorf("body is larger than %d bytes", MaxGrabBody)

// decodeGrab reads and validates a POST /grab body: one JSON object with
// exactly the known fields, both ids valid, at most MaxGrabBody bytes.
// With userOptional (user auth on: the token names the user) user_id may be
// left out.
func decodeGrab(body io.Reader, userOptional bool) (grabRequest, error) {
	var req grabRequest
	bp := bodyPool.Get().(*[MaxGrabBody + 1]byte)
	defer bodyPool.Put(bp)
	n, err := io.ReadFull(body, bp[:])
	switch {
	case n > MaxGrabBody:
		return req, errBodyTooLarge
	case err != nil && err != io.EOF && err != io.ErrUnexpectedEOF:
		return req, fmt.Errorf("reading body: %w", err)
	}
	buf := bp[:n]
	if fast, ok := fastGrab(buf); ok {
		req = fast
	} else {
		// Its own variable: the decoder keeps its address, and req's
		// would be allocated for every grab, the fast ones too.
		var strict grabRequest
		err := decodeStrict(buf, &strict)
		req = strict
		if err != nil {
			return req, err
		}
		if err := rain.CheckID("pool_id", req.PoolID); err != nil {
			return req, err
		}
	}
	if req.UserID == "" && userOptional {
		return req, nil
	}
	return req, rain.CheckID("user_id", req.UserID)
}

// bodyPool holds grab body buffers: one more byte than allowed, to tell a
// body at the limit from one over it.
var bodyPool = sync.Pool{New: func() any { return new([MaxGrabBody + 1]byte) }}

// fastGrab parses the common body, {"pool_id":"…","user_id":"…"} in either
// order, or {"pool_id":"…"} alone (user_id is then ""; decodeGrab decides),
// with any JSON whitespace and ids of valid characters only, without
// encoding/json. Anything else (escapes, other or repeated keys, invalid ids,
// malformed input) returns ok = false and goes to the strict decoder, which
// accepts or refuses it; FuzzDecodeGrab checks the two always agree.
func fastGrab(b []byte) (req grabRequest, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return req, false
	}
	var havePool, haveUser bool
	for {
		i = skipSpace(b, i+1)
		key, j, ok := fastString(b, i)
		if !ok {
			return req, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return req, false
		}
		i = skipSpace(b, i+1)
		val, j, ok := fastString(b, i)
		if !ok || len(val) == 0 || len(val) > rain.MaxIDLen {
			return req, false
		}
		switch string(key) {
		case "pool_id":
			if havePool {
				return req, false
			}
			havePool, req.PoolID = true, string(val)
		case "user_id":
			if haveUser {
				return req, false
			}
			haveUser, req.UserID = true, string(val)
		default:
			return req, false
		}
		i = skipSpace(b, j)
		if i >= len(b) {
			return req, false
		}
		if b[i] == '}' {
			break
		}
		if b[i] != ',' {
			return req, false
		}
	}
	if skipSpace(b, i+1) != len(b) || !havePool {
		return req, false
	}
	return req, true
}

// fastString reads a JSON string at b[i] made only of id characters (which
// need no escaping) and returns its contents and the index after it.
func fastString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		c := b[j]
		if c == '"' {
			return b[i+1 : j], j + 1, true
		}
		if !rain.IDByte(c) {
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipSpace returns the index of the first non-whitespace byte at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// decodeStrict decodes exactly one JSON object whose keys are v's fields,
// named exactly (case-sensitive), each at most once.
func decodeStrict(buf []byte, v any) error {
	if i := skipSpace(buf, 0); i == len(buf) || buf[i] != '{' {
		return errors.New("malformed JSON: the body must be an object")
	}
	if err := checkKeys(buf, fieldNames(reflect.TypeOf(v).Elem())); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if dec.More() {
		return errors.New("malformed JSON: more than one value in the body")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("malformed JSON: trailing data after the object")
	}
	return nil
}

// checkKeys reads the top-level object of buf and refuses a key that is not
// one of names exactly (encoding/json would match it ignoring case) or that
// appears twice (encoding/json would keep the last, where another reader
// may keep the first). Malformed JSON is left to the decoder's message.
func checkKeys(buf []byte, names map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(buf))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool, len(names))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := t.(string)
		switch {
		case seen[key]:
			return fmt.Errorf("malformed JSON: duplicate key %q", key)
		case !names[key]:
			return fmt.Errorf("malformed JSON: unknown field %q (names are case-sensitive)", key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// fieldNames are the JSON names of struct type t's fields.
var fieldNamesCache sync.Map // reflect.Type -> map[string]bool

func fieldNames(t reflect.Type) map[string]bool {
	if m, ok := fieldNamesCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = true
	}
	fieldNamesCache.Store(t, m)
	return m
}
