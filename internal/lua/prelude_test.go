package lua

// The money rules are told once, in prelude.lua: these tests read every
// script for a move written outside it.

import (
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// moves is, for every script that moves money, the prelude functions it
// calls; every other script calls none. A script that moves money on its
// own, or a rule no script uses, fails TestMoneyMovesOnlyInThePrelude.
var moves = map[string][]string{
	"setup":        {"zero_books"},
	"load":         {"load_stock", "write_books"},
	"claim_many":   {"pop_to_held", "release_held", "write_books"},
	"release":      {"release_held", "write_books"},
	"confirm":      {"confirm_held", "write_books"},
	"confirm_many": {"confirm_held", "write_books"},
	"take":         {"pop_to_transfer", "write_books"},
	"adopt":        {"adopt_to_held", "write_books"},
	"ack":          {"return_transfer", "send_transfer", "write_books"},
}

// preludeHelpers are the prelude's own functions, which the rules are
// built of and no script calls.
var preludeHelpers = []string{"change", "hold", "move", "tally"}

// TestMoneyMovesOnlyInThePrelude: every embedded script is loaded with the
// prelude in front; the scripts that move money call the prelude's moves
// (moves), and no script writes a money counter, the stock list, a grant,
// a deadline, a transfer or an outbox entry itself (moneyWrites).
func TestMoneyMovesOnlyInThePrelude(t *testing.T) {
	files, err := fs.Glob(sources, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if name := strings.TrimSuffix(f, ".lua"); name != "prelude" {
			names = append(names, name)
		}
	}
	if loaded := slices.Sorted(maps.Keys(scripts)); !slices.Equal(names, loaded) {
		t.Fatalf("embedded scripts %v, loaded %v: every *.lua file but the prelude is a script of lua.go", names, loaded)
	}

	defined := regexp.MustCompile(`(?m)^local function (\w+)\(`).FindAllStringSubmatch(prelude, -1)
	var rules []string
	for _, d := range defined {
		if !slices.Contains(preludeHelpers, d[1]) {
			rules = append(rules, d[1])
		}
	}
	slices.Sort(rules)
	var used []string
	for _, fs := range moves {
		used = append(used, fs...)
	}
	if used = slices.Compact(slices.Sorted(slices.Values(used))); !slices.Equal(rules, used) {
		t.Errorf("the prelude's moves %v, the scripts use %v: each rule of the prelude is used, and only those", rules, used)
	}

	for _, name := range names {
		body := source(name)
		sum := sha1.Sum([]byte(prelude + body))
		if got, want := scripts[name].Hash(), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: EVALSHA sends %s, want %s, the SHA1 of the prelude and the script", name, got, want)
		}
		code := stripComments(body)
		var calls []string
		for _, f := range append(rules, preludeHelpers...) {
			if regexp.MustCompile(`\b` + f + `\(`).MatchString(code) {
				calls = append(calls, f)
			}
		}
		slices.Sort(calls)
		if !slices.Equal(calls, moves[name]) {
			t.Errorf("%s.lua calls the prelude's %v, want %v", name, calls, moves[name])
		}
		for _, w := range moneyWrites(body) {
			t.Errorf("%s.lua: %s", name, w)
		}
	}
}

// TestMoneyWritesFound: moneyWrites finds each kind of money move written
// outside the prelude, and passes what scripts may write themselves.
func TestMoneyWritesFound(t *testing.T) {
	head := "-- KEYS[1] meta  KEYS[2] stock  KEYS[3] grants  KEYS[4] deadlines\n" +
		"-- KEYS[5] outbox  KEYS[6] transfers  KEYS[7] resolved  KEYS[8] reserve\n" +
		"local meta, grants = KEYS[1], KEYS[3]\nlocal k = {meta = meta}\n"
	for _, tc := range []struct {
		code  string
		found bool
	}{
		{"redis.call('HINCRBY', meta, 'held_count', -1)", true},
		{"redis.call('HINCRBY', KEYS[1], 'version', 1) -- a comment", true},
		{"redis.call('HINCRBY', meta, 'resent', 1)", false},
		{"redis.call('HSET', meta, 'stock_cents', '0')", true},
		{"local f = 'held_count'\nredis.call('HSET', meta, f, 0)", true},
		{"redis.call('HSET', meta, 'state', 'closing', 'ended', '1')", false},
		{"redis.call('HMGET', meta, 'held_count', 'stock_cents')", false},
		{"redis.call('HSET', meta,\n  'state', 'open', 'confirmed_count', 0)", true},
		{"redis.call('RPUSH', KEYS[2], 5)", true},
		{"redis.call('LPOP', stock)", true},
		{"redis.call('LLEN', stock)", false},
		{"redis.call('HSET', grants, user, 'c' .. rest)", true},
		{"redis.call('HSET', KEYS[3], user, 'c' .. rest)", true},
		{"redis.call('HSET', k.grants, user, 'c' .. rest)", true},
		{"redis.call('HGET', grants, user)", false},
		{"redis.call('ZADD', KEYS[4], 1, user)", true},
		{"redis.call('ZREM', KEYS[4], user)", false},
		{"redis.call('XADD', KEYS[5], '*', 'type', 'grant')", true},
		{"redis.call('XACK', KEYS[5], 'g', id)", false},
		{"redis.call('HDEL', KEYS[6], token)", true},
		{"redis.call('HSET', KEYS[7], token, 'a:' .. t)", true},
		{"redis.call('HSET', KEYS[8], user, token)", false},
		{"redis.call('DEL', KEYS[3])", true},
		{"local s = '-- not a comment'\nredis.call('HSET', meta, 'state', s)", false},
	} {
		if got := moneyWrites(head + tc.code); (len(got) > 0) != tc.found {
			t.Errorf("moneyWrites(%q) = %q, want found %v", tc.code, got, tc.found)
		}
	}
}

// moneyCounter matches the name of a money counter of a sub-pool's meta,
// or the version every money move bumps.
var moneyCounter = regexp.MustCompile(`^(stock|held|confirmed|released|inflight|received|sent)_(count|cents)$|^version$`)

// Commands by what moneyWrites makes of them.
var (
	listWrites = map[string]bool{"LPUSH": true, "RPUSH": true, "LPUSHX": true, "RPUSHX": true, "LPOP": true,
		"RPOP": true, "LMPOP": true, "LMOVE": true, "BLMOVE": true, "RPOPLPUSH": true, "LSET": true, "LREM": true,
		"LTRIM": true, "LINSERT": true}
	hashSets  = map[string]bool{"HSET": true, "HMSET": true, "HSETNX": true}
	keyWrites = map[string]bool{"HSET": true, "HMSET": true, "HSETNX": true, "HDEL": true, "ZADD": true,
		"DEL": true, "UNLINK": true, "RENAME": true, "COPY": true, "RESTORE": true, "SET": true}
	moneyKeys = map[string]bool{"stock": true, "grants": true, "deadlines": true, "outbox": true,
		"transfers": true, "resolved": true}
)

// moneyWrites lists the money moves a script (its text, without the
// prelude) writes itself: a money counter, the stock list, a grant, the
// deadline index, a transfer (in flight or resolved) or an outbox entry.
// A key is known by the name the script's header gives it ("KEYS[n]
// name"), through the locals and table fields the script gives KEYS[n]
// to. The meta's other fields (named by literals), the spill's
// reservations and verdicts, the deadline entries release.lua drops and
// the entries settlement acknowledges are the script's own; so are reads.
func moneyWrites(script string) []string {
	code := stripComments(script)
	role := map[string]string{}
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "--") {
			for _, m := range regexp.MustCompile(`KEYS\[(\d+)\][ \t]+(\w+)`).FindAllStringSubmatch(line, -1) {
				role["KEYS["+m[1]+"]"] = m[2]
			}
		}
	}
	keyRole := func(expr string) string {
		if r, ok := role[expr]; ok {
			return r
		}
		if _, field, ok := strings.Cut(expr, "."); ok {
			return field // a key table's field, named for its key
		}
		return expr
	}
	for _, m := range regexp.MustCompile(`local ([\w, ]+?) = ([^\n]+)`).FindAllStringSubmatch(code, -1) {
		names, values := strings.Split(m[1], ","), strings.Split(m[2], ",")
		if len(names) == len(values) {
			for i := range names {
				if r, ok := role[strings.TrimSpace(values[i])]; ok {
					role[strings.TrimSpace(names[i])] = r
				}
			}
		}
	}
	for _, m := range regexp.MustCompile(`(\w+)\s*=\s*\{([^}]*)\}`).FindAllStringSubmatch(code, -1) {
		for _, f := range regexp.MustCompile(`(\w+)\s*=\s*(KEYS\[\d+\]|\w+)`).FindAllStringSubmatch(m[2], -1) {
			role[m[1]+"."+f[1]] = keyRole(f[2])
		}
	}

	var found []string
	for _, call := range redisCalls(code) {
		if len(call) < 2 {
			continue
		}
		cmd, _ := literal(call[0])
		cmd = strings.ToUpper(cmd)
		key := keyRole(call[1])
		var why string
		switch {
		case cmd == "HINCRBY" || cmd == "HINCRBYFLOAT":
			if s, ok := literal(call[min(2, len(call)-1)]); !ok || s != "resent" {
				why = "only the prelude moves the counters"
			}
		case listWrites[cmd]:
			why = "only the prelude moves the stock"
		case cmd == "XADD":
			why = "only the prelude writes grants and releases to the outbox"
		case key == "meta" && (hashSets[cmd] || cmd == "HDEL"):
			for i := 2; i < len(call); i++ {
				field := cmd == "HDEL" || i%2 == 0
				if _, ok := literal(call[i]); field && !ok && call[i] != "unpack(zero_books())" {
					why = "a meta field named by a variable could be a counter"
					break
				}
			}
		case moneyKeys[key] && keyWrites[cmd]:
			why = "only the prelude writes the stock, grants, deadlines, transfers and outbox"
		}
		if why == "" && cmd != "HGET" && cmd != "HMGET" {
			for _, a := range call[2:] {
				if s, ok := literal(a); ok && moneyCounter.MatchString(s) {
					why = "only the prelude writes the money counters"
					break
				}
			}
		}
		if why != "" {
			found = append(found, cmd+" "+strings.Join(call[1:], ", ")+": "+why)
		}
	}
	return found
}

// literal is the value of a Lua string literal a, and whether it is one.
func literal(a string) (string, bool) {
	if len(a) >= 2 && (a[0] == '\'' || a[0] == '"') && a[len(a)-1] == a[0] && !strings.ContainsAny(a[1:len(a)-1], `'"\`) {
		return a[1 : len(a)-1], true
	}
	return "", false
}

// stripComments removes Lua's line comments ("--" to the end of the line,
// outside string literals). The scripts use no long strings or block
// comments; one would make this fail loudly.
func stripComments(code string) string {
	if strings.Contains(code, "[[") {
		panic("stripComments: long strings and block comments are not read")
	}
	var b strings.Builder
	var quote byte
	for i := 0; i < len(code); i++ {
		c := code[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(code) {
				b.WriteByte(c)
				i++
				c = code[i]
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(code) && code[i+1] == '-':
			for i < len(code) && code[i] != '\n' {
				i++
			}
			if i < len(code) {
				b.WriteByte('\n')
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// redisCalls lists every redis.call and redis.pcall in code (without
// comments), each as its arguments' source text, split at the call's own
// commas.
func redisCalls(code string) [][]string {
	var calls [][]string
	for _, loc := range regexp.MustCompile(`redis\.p?call\(`).FindAllStringIndex(code, -1) {
		var args []string
		depth, start := 0, loc[1]
		var quote byte
	scan:
		for i := loc[1]; i < len(code); i++ {
			c := code[i]
			switch {
			case quote != 0:
				if c == '\\' {
					i++
				} else if c == quote {
					quote = 0
				}
			case c == '\'' || c == '"':
				quote = c
			case c == '(' || c == '{' || c == '[':
				depth++
			case c == ')' || c == '}' || c == ']':
				if depth == 0 {
					args = append(args, strings.TrimSpace(code[start:i]))
					break scan
				}
				depth--
			case c == ',' && depth == 0:
				args = append(args, strings.TrimSpace(code[start:i]))
				start = i + 1
			}
		}
		calls = append(calls, args)
	}
	return calls
}
