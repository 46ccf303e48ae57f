package lua

// The money rules are told once, in prelude.lua: these tests read every
// script for a move written outside it, and walk every move on real
// sub-pools checking conservation after each.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
)

// moves is, for every script that moves money, the prelude functions it
// calls; every other script calls none. A script that moves money on its
// own, or a rule no script uses, fails TestMoneyMovesOnlyInThePrelude.
var moves = map[string][]string{
	"setup":        {"zero_books"},
	"load":         {"load_stock", "write_books"},
	"claim_many":   {"pop_to_held", "release_held", "write_books"},
	"release":      {"release_due", "write_books"},
	"confirm":      {"confirm_held", "write_books"},
	"confirm_many": {"confirm_held", "write_books"},
	"take":         {"pop_to_transfer", "write_books"},
	"adopt":        {"adopt_to_held", "write_books"},
	"ack":          {"return_transfer", "send_transfer", "write_books"},
}

// preludeHelpers are the prelude's own functions, which the rules are
// built of and no script calls.
var preludeHelpers = []string{"change", "hold", "integer", "move", "tally"}

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
	for _, fns := range moves {
		used = append(used, fns...)
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
		for _, f := range slices.Concat(rules, preludeHelpers) {
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
		"-- KEYS[10] gen\n" +
		"local meta, grants = KEYS[1], KEYS[3]\nlocal k = {meta = meta}\n"
	for _, tc := range []struct {
		code  string
		found bool
	}{
		{"redis.call('HINCRBY', meta, 'held_count', -1)", true},
		{"redis.call('HINCRBY', KEYS[1], 'version', 1) -- a comment", true},
		{"redis.call('HINCRBY', meta, 'resent', 1)", false},
		{"redis.call('HINCRBY', KEYS[9], ARGV[1], 1)", true}, // a key the header does not name
		{"local gen = KEYS[10]\nredis.call('HINCRBY', gen, ARGV[1], 1)", false},
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
var moneyCounter = regexp.MustCompile(`^(stock|held|confirmed|released|inflight|received|sent)_(count|cents)$|^version$|^batched_users$`)

// Commands by what moneyWrites makes of them.
var (
	listWrites = map[string]bool{"LPUSH": true, "RPUSH": true, "LPUSHX": true, "RPUSHX": true, "LPOP": true,
		"RPOP": true, "LMPOP": true, "LMOVE": true, "BLMOVE": true, "RPOPLPUSH": true, "LSET": true, "LREM": true,
		"LTRIM": true, "LINSERT": true}
	hashSets  = map[string]bool{"HSET": true, "HMSET": true, "HSETNX": true}
	keyWrites = map[string]bool{"HSET": true, "HMSET": true, "HSETNX": true, "HDEL": true, "ZADD": true,
		"DEL": true, "UNLINK": true, "RENAME": true, "COPY": true, "RESTORE": true, "SET": true}
	moneyKeys = map[string]bool{"stock": true, "grants": true, "deadlines": true, "batches": true, "outbox": true,
		"transfers": true, "resolved": true}
)

// moneyWrites lists the money moves a script (its text, without the
// prelude) writes itself: a money counter, the stock list, a grant, the
// deadline index, a transfer (in flight or resolved) or an outbox entry.
// A key is known by the name the script's header gives it ("KEYS[n]
// name"), through the locals and table fields the script gives KEYS[n]
// to. The meta's other fields (named by literals), the spill's
// reservations and verdicts and the entries settlement acknowledges are
// the script's own; so are reads.
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
		case (cmd == "HINCRBY" || cmd == "HINCRBYFLOAT") && (key == "meta" || !slices.Contains(slices.Collect(maps.Values(role)), key)):
			// A counter of the meta, or of a key the header does not name.
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

// TestEveryMoveConserves: a random walk over every script that moves
// money (claims in batches, releases, confirms one by one and in batches,
// and the spill's take, adopt, ack, untake, decide and abort, some of its
// steps left for the recovery) on three sub-pools of a real redis-server,
// with holds that run out at once and holds of a minute. After every step
// each sub-pool keeps count + received - sent = stock + held + confirmed +
// inflight, in count and in cents, its counters agree with its records,
// and every preloaded amount is in exactly one place across the pool: the
// stock, a held or confirmed grant, or a transfer in flight that its home
// has not adopted. Once every spill is resolved nothing is in flight and
// what was received is what was sent.
func TestEveryMoveConserves(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	rng := rand.New(rand.NewPCG(5, 31))
	const K = 3
	for round, hold := range []int64{0, 60_000} {
		keys := make([]rain.Keys, K)
		var preloaded []int64
		for j := range keys {
			amounts := make([]int64, 2+rng.IntN(12))
			for i := range amounts {
				amounts[i] = 1 + rng.Int64N(900)
			}
			preloaded = append(preloaded, amounts...)
			keys[j] = openSubPool(t, c, K*round+j, hold, amounts...)
		}
		slices.Sort(preloaded)
		w := &walk{t: t, c: c, keys: keys, preloaded: preloaded}
		serial := int64(1000 * (round + 1))
		for step := range 400 {
			j := rng.IntN(K)
			k := &keys[j]
			valid := []int64{0, 60_000, 60_000}[rng.IntN(3)] // 0: every reservation has lapsed
			var what string
			switch rng.IntN(8) {
			case 0, 1, 2:
				var batch []ClaimArg
				for range 1 + rng.IntN(5) {
					serial++
					user := "u" + strconv.Itoa(rng.IntN(20))
					if len(batch) > 0 && rng.IntN(4) == 0 {
						user = batch[len(batch)-1].User // twice in a batch: the second finds the first's grant
					}
					batch = append(batch, ClaimArg{User: user, Serial: serial, Token: strconv.FormatInt(serial, 10)})
				}
				// Any form of the outbox and of the deadline index, as during
				// an upgrade.
				form := Form{Outbox: OutboxForm(rng.IntN(3)), BatchedDeadlines: rng.IntN(3) > 0}
				pipe := c.Pipeline()
				cmd := ClaimManyCmd(ctx, pipe, k, valid, false, form, batch, nil)
				_, _ = pipe.Exec(ctx)
				res, errs, err := ParseClaimMany(cmd, len(batch))
				if err != nil {
					t.Fatal(err)
				}
				what = fmt.Sprintf("claim_many %+v at %d: %v %v", form, j, res, errs)
				for i, cl := range res {
					if cl.Outcome == Reserved && rng.IntN(4) > 0 {
						what += "; " + w.spill(rng, j, batch[i], valid)
					}
				}
			case 3:
				r, err := ReleaseExpired(ctx, c, k, 1+rng.IntN(4))
				if err != nil {
					t.Fatal(err)
				}
				what = fmt.Sprintf("release at %d: %+v", j, r)
			case 4:
				user, serial, _, ok := w.grant(rng, j)
				if !ok {
					continue
				}
				r, err := Confirm(ctx, c, k, user, serial)
				if err != nil {
					t.Fatal(err)
				}
				what = fmt.Sprintf("confirm %s %d at %d: %v", user, serial, j, r)
			case 5:
				var batch []ConfirmArg
				for range 1 + rng.IntN(4) {
					if user, serial, amount, ok := w.grant(rng, j); ok {
						if rng.IntN(6) == 0 {
							amount++ // refused: not the grant's amount
						}
						batch = append(batch, ConfirmArg{User: user, Serial: serial, Amount: amount})
					}
				}
				if len(batch) == 0 {
					continue
				}
				r, errs, err := ConfirmMany(ctx, c, k, batch)
				if err != nil {
					t.Fatal(err)
				}
				what = fmt.Sprintf("confirm_many at %d: %v %v", j, r, errs)
			case 6:
				what = fmt.Sprintf("recover at %d: %s", j, w.recoverSpills(j, valid, rng.IntN(2) == 0))
			case 7:
				if r, err := c.HGetAll(ctx, k.Reserve).Result(); err == nil {
					for user, rec := range r {
						token, _, _ := strings.Cut(rec, ":")
						adopted, err := Abort(ctx, c, k, user, token, rng.IntN(2) == 0)
						if err != nil {
							t.Fatal(err)
						}
						what = fmt.Sprintf("abort %s %s at %d: adopted %v", user, token, j, adopted)
						break
					}
				}
			}
			w.check(fmt.Sprintf("round %d step %d: %s", round, step, what))
		}
		for j := range keys {
			w.recoverSpills(j, 60_000, true)
		}
		w.check(fmt.Sprintf("round %d: every spill resolved", round))
		var received, sent, inflight int64
		for _, k := range keys {
			m, err := c.HMGet(ctx, k.Meta, "received_cents", "sent_cents", "inflight_count").Result()
			if err != nil {
				t.Fatal(err)
			}
			received, sent, inflight = received+num(m[0]), sent+num(m[1]), inflight+num(m[2])
		}
		if inflight != 0 || received != sent {
			t.Fatalf("round %d, every spill resolved: %d transfers in flight, %d cents received, %d sent; want none, and as many received as sent",
				round, inflight, received, sent)
		}
		if hold != 0 {
			continue
		}
		// Every hold has run out: the reaper, a few users at a time,
		// releases every grant still held and empties the deadline index
		// (a member outlives the grants it names that were confirmed or
		// released first, until its deadline).
		for j := range keys {
			for calls := 0; ; calls++ {
				r, err := ReleaseExpired(ctx, c, &keys[j], 1+rng.IntN(4))
				if err != nil {
					t.Fatal(err)
				}
				if !r.More {
					break
				}
				if calls > 1000 {
					t.Fatalf("sub-pool %d: the reaper still has more after %d calls", j, calls)
				}
			}
			a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: subIndex(keys[j])})
			if err != nil || a.HeldCount != 0 || a.GrantsHeld != 0 || a.DeadlineEntries != 0 {
				t.Fatalf("round %d, sub-pool %d, every hold run out and reaped: audit %+v, %v; want nothing held and an empty deadline index",
					round, j, a, err)
			}
		}
		w.check(fmt.Sprintf("round %d: every hold reaped", round))
	}
}

func num(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// walk is the state of TestEveryMoveConserves.
type walk struct {
	t         *testing.T
	c         *redis.Client
	keys      []rain.Keys
	preloaded []int64 // every amount preloaded into the pool, sorted
}

// grant picks a grant of sub-pool j, in whatever state.
func (w *walk) grant(rng *rand.Rand, j int) (user string, serial, amount int64, ok bool) {
	g, err := w.c.HGetAll(context.Background(), w.keys[j].Grants).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	users := slices.Sorted(maps.Keys(g))
	if len(users) == 0 {
		return "", 0, 0, false
	}
	user = users[rng.IntN(len(users))]
	f := strings.Split(g[user], ":")
	amount, _ = strconv.ParseInt(f[1], 10, 64)
	serial, _ = strconv.ParseInt(f[2], 10, 64)
	return user, serial, amount, true
}

// spill runs the spill of claim cl, reserved at home h, from a sibling;
// some of its steps are left undone, for the recovery.
func (w *walk) spill(rng *rand.Rand, h int, cl ClaimArg, valid int64) string {
	ctx := context.Background()
	j := (h + 1 + rng.IntN(len(w.keys)-1)) % len(w.keys)
	for s := range w.keys { // as the grab does, skip siblings known to be empty
		if n, err := w.c.LLen(ctx, w.keys[s].Stock).Result(); err == nil && n > 0 && s != h && rng.IntN(4) > 0 {
			j = s
		}
	}
	taken, amount, err := Take(ctx, w.c, &w.keys[j], cl.Token, h, cl.User, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	if taken != TakenAmount {
		if _, err := Abort(ctx, w.c, &w.keys[h], cl.User, cl.Token, false); err != nil {
			w.t.Fatal(err)
		}
		return fmt.Sprintf("take at %d: %v, aborted", j, taken)
	}
	if rng.IntN(5) == 0 {
		return fmt.Sprintf("took %d at %d, left in flight", amount, j)
	}
	_, ok, err := Adopt(ctx, w.c, &w.keys[h], cl.User, cl.Token, cl.Serial, amount, j, valid, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	if rng.IntN(5) == 0 {
		return fmt.Sprintf("took %d at %d, adopt %v, left unresolved", amount, j, ok)
	}
	resolve := Untake
	if ok {
		resolve = Ack
	}
	r, err := resolve(ctx, w.c, &w.keys[j], cl.Token)
	if err != nil {
		w.t.Fatal(err)
	}
	return fmt.Sprintf("took %d at %d, adopt %v, %v", amount, j, ok, r)
}

// recoverSpills resolves the transfers in flight out of sub-pool j by their
// homes' verdicts, as the reaper does; without all, only one of them.
func (w *walk) recoverSpills(j int, valid int64, all bool) string {
	ctx := context.Background()
	f, err := StaleTransfers(ctx, w.c, &w.keys[j], valid, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	var done []string
	for _, tr := range f.Stale {
		v, err := Decide(ctx, w.c, &w.keys[tr.Home], tr.Token, tr.User, 0)
		if err != nil {
			w.t.Fatal(err)
		}
		resolve := Untake
		if v.Adopted && v.Origin == j && v.Amount == tr.Amount {
			resolve = Ack
		}
		r, err := resolve(ctx, w.c, &w.keys[j], tr.Token)
		if err != nil {
			w.t.Fatal(err)
		}
		done = append(done, fmt.Sprintf("%s %+v: %v", tr.Token, v, r))
		if !all {
			break
		}
	}
	return strings.Join(done, ", ")
}

// check holds the walk's invariants after a step.
func (w *walk) check(after string) {
	w.t.Helper()
	ctx := context.Background()
	var amounts []int64
	verdicts := make([]map[string]string, len(w.keys))
	for h, k := range w.keys {
		v, err := w.c.HGetAll(ctx, k.Verdicts).Result()
		if err != nil {
			w.t.Fatal(err)
		}
		verdicts[h] = v
	}
	for j, k := range w.keys {
		a, err := AuditSubPool(ctx, w.c, rain.SubPool{Pool: "r", Index: subIndex(k)})
		if err != nil || !a.Recounted {
			w.t.Fatalf("after %s: audit of sub-pool %d: %+v, %v", after, j, a, err)
		}
		for _, eq := range []struct {
			what        string
			left, right int64
		}{
			{"count + received - sent = stock + held + confirmed + inflight",
				a.Count + a.ReceivedCount - a.SentCount, a.StockCount + a.HeldCount + a.ConfirmedCount + a.InflightCount},
			{"cents + received - sent = stock + held + confirmed + inflight",
				a.Cents + a.ReceivedCents - a.SentCents, a.StockCents + a.HeldCents + a.ConfirmedCents + a.InflightCents},
			{"stock_count = the stock list's length", a.StockCount, a.ListLen},
			{"stock_cents = the stock list's sum", a.StockCents, a.ListSum},
			{"held_count = grants held", a.HeldCount, a.GrantsHeld},
			{"held_cents = grants held", a.HeldCents, a.GrantsHeldCents},
			{"held grants the deadline index names = grants held", a.GrantsHeld, a.GrantsHeld - a.Unindexed},
			{"users the deadline index names, at least held_count", a.HeldCount, min(a.HeldCount, a.DeadlineEntries)},
			{"confirmed_count = grants confirmed", a.ConfirmedCount, a.GrantsConfirmed},
			{"confirmed_cents = grants confirmed", a.ConfirmedCents, a.GrantsConfirmedCents},
			{"inflight_count = transfers in flight", a.InflightCount, a.Transfers},
			{"inflight_cents = transfers in flight", a.InflightCents, a.TransfersCents},
			{"sent_count = acked transfers", a.SentCount, a.Acked},
			{"sent_cents = acked transfers", a.SentCents, a.AckedCents},
			{"received_count = adopted verdicts", a.ReceivedCount, a.Adopted},
			{"received_cents = adopted verdicts", a.ReceivedCents, a.AdoptedCents},
			{"bad records", a.BadRecords, 0},
			{"duplicate serials", a.DuplicateSerials, 0},
		} {
			if eq.left != eq.right {
				w.t.Fatalf("after %s: sub-pool %d: %s: %d != %d\n%+v", after, j, eq.what, eq.left, eq.right, a)
			}
		}
		stock, err := w.c.LRange(ctx, k.Stock, 0, -1).Result()
		if err != nil {
			w.t.Fatal(err)
		}
		for _, s := range stock {
			amounts = append(amounts, num(s))
		}
		grants, err := w.c.HGetAll(ctx, k.Grants).Result()
		if err != nil {
			w.t.Fatal(err)
		}
		w.checkOutbox(after, j, k, grants)
		for _, g := range grants {
			if f := strings.Split(g, ":"); f[0] == "h" || f[0] == "c" {
				amounts = append(amounts, num(f[1]))
			}
		}
		for token, rec := range a.TransferRecords {
			tr, err := ParseTransfer(rec, false)
			if err != nil {
				w.t.Fatal(err)
			}
			if v, err := ParseVerdict(verdicts[tr.Home][token]); err != nil || !v.Adopted || v.Origin != j {
				amounts = append(amounts, tr.Amount) // in flight, not granted at its home
			}
		}
	}
	slices.Sort(amounts)
	if !slices.Equal(amounts, w.preloaded) {
		w.t.Fatalf("after %s: the amounts in stock, held, confirmed and in flight are %v, want the preloaded %v", after, amounts, w.preloaded)
	}
}

// checkOutbox checks that sub-pool j's outbox (never settled in a walk)
// has an entry of every grant its grants hash holds (held, confirmed or
// released: the user, amount and serial), of every serial once, and a
// release entry of every grant released: whatever the form, settlement
// would pay every grant made.
func (w *walk) checkOutbox(after string, j int, k rain.Keys, grants map[string]string) {
	w.t.Helper()
	entries, err := w.c.XRange(context.Background(), k.Outbox, "-", "+").Result()
	if err != nil {
		w.t.Fatal(err)
	}
	made, released := map[int64]OutboxEntry{}, map[int64]bool{}
	for _, en := range entries {
		es, err := ParseOutboxEntries(en.Values)
		if err != nil {
			w.t.Fatalf("after %s: sub-pool %d: outbox entry %v: %v", after, j, en.Values, err)
		}
		for _, e := range es {
			if e.Release {
				released[e.Serial] = true
				continue
			}
			if _, twice := made[e.Serial]; twice {
				w.t.Fatalf("after %s: sub-pool %d: serial %d in two grant entries of the outbox", after, j, e.Serial)
			}
			made[e.Serial] = e
		}
	}
	for user, rec := range grants {
		f := strings.Split(rec, ":")
		serial := num(f[2])
		if e, ok := made[serial]; !ok || e.User != user || e.Amount != num(f[1]) {
			w.t.Fatalf("after %s: sub-pool %d: grant %s %s has outbox entry %+v (%v); want its user and amount", after, j, user, rec, e, ok)
		}
		if f[0] == "r" && !released[serial] {
			w.t.Fatalf("after %s: sub-pool %d: grant %s %s released without a release entry", after, j, user, rec)
		}
	}
}

// subIndex is the index of the sub-pool whose keys k are.
func subIndex(k rain.Keys) int {
	for i := 0; ; i++ {
		if (rain.SubPool{Pool: "r", Index: i}).Keys() == k {
			return i
		}
	}
}

// TestAnIDWithASpaceIsRefusedUnwritten: the deadline index separates the
// users of a batch with spaces, so claim_many refuses a claim whose user id
// holds one (rain.ValidID refuses it long before) and writes nothing for
// it, while the rest of the batch is granted and indexed.
func TestAnIDWithASpaceIsRefusedUnwritten(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 60_000, 100, 200, 300)
	res, errs, err := ClaimMany(ctx, c, &k, 0, []ClaimArg{{User: "a b", Serial: 1}, {User: "a", Serial: 2}, {User: "b", Serial: 3}, {User: "", Serial: 4}})
	if err != nil || errs[0] == nil || errs[1] != nil || res[1].Outcome != Granted || errs[2] != nil || res[2].Outcome != Granted || errs[3] == nil {
		t.Fatalf("claims = %+v, %v, %v; want the first refused with an error, the others granted", res, errs, err)
	}
	a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
	if err != nil || !a.Recounted || a.HeldCount != 2 || a.GrantsHeld != 2 || a.StockCount != 1 || a.ListLen != 1 ||
		a.Unindexed != 0 || a.DeadlineEntries != 2 {
		t.Fatalf("audit = %+v, %v; want two grants held and named by the index, one amount in the stock", a, err)
	}
	if n, err := c.HExists(ctx, k.Grants, "a b").Result(); err != nil || n {
		t.Fatalf("a grant of %q: %v, %v; want none", "a b", n, err)
	}
}

// TestReleaseTakesWholeBatches: a release call looks at whole members of
// the deadline index's batches (read a few at a time) until it has looked
// at its limit of users, says there is more, and the next call goes on
// until every grant is released and the index is empty.
func TestReleaseTakesWholeBatches(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	amounts := make([]int64, 60)
	for i := range amounts {
		amounts[i] = int64(i + 1)
	}
	k := openSubPool(t, c, 0, 0, amounts...) // holds run out at once
	for b := range 20 {
		batch := []ClaimArg{{User: fmt.Sprint("a", b), Serial: int64(3*b + 1)}, {User: fmt.Sprint("b", b), Serial: int64(3*b + 2)},
			{User: fmt.Sprint("c", b), Serial: int64(3*b + 3)}}
		pipe := c.Pipeline()
		cmd := ClaimManyCmd(ctx, pipe, &k, 0, false, Form{BatchedDeadlines: true}, batch, nil)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if res, errs, err := ParseClaimMany(cmd, 3); err != nil || errs[0] != nil || res[2].Outcome != Granted {
			t.Fatalf("batch %d: %+v, %v, %v; want granted", b, res, errs, err)
		}
	}
	if n, err := c.ZCard(ctx, k.Batches).Result(); err != nil || n != 20 {
		t.Fatalf("batches = %d, %v; want 20 members", n, err)
	}
	r, err := ReleaseExpired(ctx, c, &k, 10)
	if err != nil || r.Count != 12 || !r.More {
		t.Fatalf("release of 10 = %+v, %v; want the 12 grants of 4 whole members, and more", r, err)
	}
	if r, err = ReleaseExpired(ctx, c, &k, 500); err != nil || r.Count != 48 || r.More || r.Held != 0 {
		t.Fatalf("release of 500 = %+v, %v; want the other 48 (16 members, read 8 at a time), no more, an empty index", r, err)
	}
	a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
	if err != nil || a.HeldCount != 0 || a.DeadlineEntries != 0 || a.StockCount != 60 {
		t.Fatalf("audit %+v, %v; want all 60 back in the stock and an empty index", a, err)
	}
}
