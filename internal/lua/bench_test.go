package lua

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
	"rain/loadtest/minimal"
)

// BenchmarkClaimMany: the claim path alone, what Redis spends per claim.
// Each iteration is one batch as a shard's lane sends it: one pipelined
// round trip holding one claim_many of `batch` new users on one sub-pool,
// on a real redis-server with AOF and appendfsync always (one fsync per
// batch), one batch in flight. Beside it, minimal/batch=N: the minimal
// design's pop-and-record script (loadtest/baseline: HGET, LPOP, HSET; no
// serial, hold, outbox or counters), N EVALSHAs of it in one pipelined
// round trip: the floor of Redis's work per claim.
//
// Redis's CPU comes from its INFO (used_cpu_sys + used_cpu_user, the whole
// process: reading, the scripts, writing, the AOF's write and fsync) over
// the measured batches; the scripts' own time from INFO commandstats
// (evalsha usec). Reported per claim (redis-us/claim, lua-us/claim), per
// batch (redis-us/batch), and as new grants per second per second of Redis
// CPU (grants/s/core: what one shard's core could grant at this batch
// size). claims/s is the wall-clock rate, which on this machine waits
// mostly on the fsync.
//
//	go test -run x -bench ClaimMany ./internal/lua
func BenchmarkClaimMany(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64, 128} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) { benchClaims(b, n, newRainClaims) })
	}
	for _, n := range []int{1, 16, 128} {
		b.Run("minimal/batch="+strconv.Itoa(n), func(b *testing.B) { benchClaims(b, n, newMinimalClaims) })
	}
}

// BenchmarkNextLevers measures what the pieces of claim_many's work per
// grant cost, by running the outbox's forms and variants of the script
// that leave a piece out (a variant is not rain's: its grants would not be
// released) beside each other, as BenchmarkClaimMany measures them:
//
//	packed          an outbox entry per grant (rain serve --outbox packed)
//	batch           one outbox entry per batch (--outbox batch)
//	batch-no-index  that, and no deadline index at all (no ZADD: what is
//	                left of the index's cost, one member per batch)
//
// A variant is the real script with its text replaced where named; a
// replacement that no longer finds its text fails the benchmark, so it
// never measures the script unchanged. docs/benchmarks.md, "The next
// levers" and "The outbox entry per batch", has the figures.
//
//	go test -run x -bench NextLevers -count 3 ./internal/lua
func BenchmarkNextLevers(b *testing.B) {
	noIndex := []string{"      if redis.call('ZADD', k.batches, shared[i], shared[i + 1]) == 1 then\n", "      if false then\n"}
	variants := []struct {
		name  string
		form  OutboxForm
		edits []string // old, new, old, new, ...
	}{
		{"packed", OutboxPacked, nil},
		{"batch", OutboxBatch, nil},
		{"batch-no-index", OutboxBatch, noIndex},
	}
	for _, v := range variants {
		src := editedClaimMany(b, v.edits)
		form := Form{Outbox: v.form, BatchedDeadlines: true}
		for _, n := range []int{16, 128} {
			b.Run(v.name+"/batch="+strconv.Itoa(n), func(b *testing.B) {
				benchClaims(b, n, func(c *redis.Client) claimer { return &rainClaims{c: c, form: form, script: redis.NewScript(src)} })
			})
		}
	}
}

// BenchmarkBatchFixedCost measures what claim_many pays once per batch,
// by variants that leave one per-batch step out (not rain's: their books
// are wrong), at the small batches a shard sees under moderate load:
//
//	rain           claim_many as rain runs it (the batch form)
//	no-meta-read   the sub-pool's meta (state, window, hold) as constants
//	no-time        the shard's clock as a constant
//	no-counters    no read and write of the meta's counters
//	no-xadd        no outbox entry
//	no-index       no deadline index member
//
// beside plain, rain's writes for a batch of new users written plainly
// (plainClaimSrc: no prelude, the counters read with the meta; not rain's,
// see there), and the minimal design's script, one EVALSHA per claim, alone
// and with the prelude in front of it (minimal+prelude: what the prelude's
// function definitions cost each call).
//
//	go test -run x -bench BatchFixedCost -benchtime 2s ./internal/lua
func BenchmarkBatchFixedCost(b *testing.B) {
	variants := []struct {
		name  string
		edits []string
	}{
		{"rain", nil},
		{"no-meta-read", []string{"local m = redis.call('HMGET', meta, 'state', 'hold_ms', 'starts_ms', 'ends_ms', 'pool', 'index', 'ended')",
			"local m = {'open', '3600000', '0', '0', 'bench', '0', false}"}},
		{"no-time", []string{"local t = redis.call('TIME')", "local t = {'1800000000', '0'}"}},
		{"no-counters", []string{"  if #booked > 0 then\n    -- One read", "  if false then\n    -- One read"}},
		{"no-xadd", []string{"      redis.call('XADD', k.outbox, '*', 'G', table.concat(outbox_grants, ' '))\n", ""}},
		{"no-index", []string{"      if redis.call('ZADD', k.batches, shared[i], shared[i + 1]) == 1 then\n", "      if false then\n",
			"      redis.call('ZADD', k.deadlines, unpack(alone))\n", ""}},
	}
	for _, n := range []int{1, 8} {
		for _, v := range variants {
			b.Run(v.name+"/batch="+strconv.Itoa(n), func(b *testing.B) {
				src := editedClaimMany(b, v.edits)
				benchClaims(b, n, func(c *redis.Client) claimer { return &rainClaims{c: c, form: benchForm, script: redis.NewScript(src)} })
			})
		}
		b.Run("plain/batch="+strconv.Itoa(n), func(b *testing.B) {
			benchClaims(b, n, func(c *redis.Client) claimer {
				return &rainClaims{c: c, form: benchForm, script: redis.NewScript(plainClaimSrc)}
			})
		})
		b.Run("minimal/batch="+strconv.Itoa(n), func(b *testing.B) { benchClaims(b, n, newMinimalClaims) })
		b.Run("minimal+prelude/batch="+strconv.Itoa(n), func(b *testing.B) {
			benchClaims(b, n, func(c *redis.Client) claimer {
				m := newMinimalClaims(c).(*minimalClaims)
				m.script = redis.NewScript(prelude + minimal.ClaimSrc)
				return m
			})
		})
	}
}

// BenchmarkScriptsInterleaved compares variants of the claim script where
// this machine's swing between runs (10 to 15%) hides what one step costs:
// each variant runs on a redis-server of its own (no AOF: only the
// script's time is read), and one iteration sends one batch of new users
// to each in turn, so that a slower stretch of the machine falls on every
// variant alike. Each reports the scripts' µs per call from its server's
// INFO commandstats (<variant>-us/call). With this many Redis processes
// taking turns on two cores, a call costs about twice what it costs on
// one Redis alone (presumably colder caches, as on 4 shards beside the
// grab service). Under aof/, rain and plain alone run the same way on
// servers with AOF and appendfsync always, as rain's shards run, and
// each also reports its server's CPU per call, the AOF's write and
// fsync included (<variant>-cpu-us/call, from INFO's used_cpu_sys and
// used_cpu_user).
//
//	rain              claim_many as rain runs it
//	plain             plainClaimSrc: rain's writes, written plainly
//	prelude+plain     the same with the prelude in front (what the prelude costs a call)
//	no-probe          claim_many without the probe of a moving slot
//	used-moves        claim_many with only the prelude's moves it calls
//
//	go test -run x -bench ScriptsInterleaved -benchtime 6000x ./internal/lua
func BenchmarkScriptsInterleaved(b *testing.B) {
	rainSrc := prelude + source("claim_many")
	noProbe := strings.Replace(rainSrc, "local probe = redis.pcall('EXISTS', 'rain:{' .. tag .. '}:never')", "local probe = 0", 1)
	usedMoves := rainSrc
	for _, name := range []string{"zero_books", "load_stock", "release_due", "confirm_held", "pop_to_transfer", "adopt_to_held", "send_transfer", "return_transfer"} {
		i := strings.Index(usedMoves, "local function "+name+"(")
		j := strings.Index(usedMoves[max(i, 0):], "\nend\n")
		if i < 0 || j < 0 {
			b.Fatalf("the prelude no longer defines %s as this benchmark cuts it out: update it", name)
		}
		usedMoves = usedMoves[:i] + usedMoves[i+j+len("\nend\n"):]
	}
	if noProbe == rainSrc {
		b.Fatal("the prelude no longer probes as this benchmark replaces: update it")
	}
	variants := []struct{ name, src string }{
		{"rain", rainSrc},
		{"plain", plainClaimSrc},
		{"prelude+plain", prelude + plainClaimSrc},
		{"no-probe", noProbe},
		{"used-moves", usedMoves},
	}
	for _, n := range []int{1, 8} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) { interleave(b, n, variants, redistest.Options{}) })
	}
	for _, n := range []int{1, 8} {
		b.Run("aof/batch="+strconv.Itoa(n), func(b *testing.B) {
			interleave(b, n, variants[:2], redistest.Options{AOF: true, Fsync: "always"})
		})
	}
}

// interleave runs BenchmarkScriptsInterleaved's variants, each on a
// redis-server of its own started with opts, one batch of n new users to
// each in turn; with AOF it reports each server's CPU per call too.
func interleave(b *testing.B, n int, variants []struct{ name, src string }, opts redistest.Options) {
	ctx := context.Background()
	claims := make([]*rainClaims, len(variants))
	cpu := make([]float64, len(variants))
	for i, v := range variants {
		c := redistest.Client(b, redistest.Start(b, opts))
		claims[i] = &rainClaims{c: c, form: benchForm, script: redis.NewScript(v.src)}
		// benchPackets outlasts -benchtime 6000x and a default run; a longer
		// one fails on a claim answered empty.
		if err := claims[i].refill(ctx, benchPackets); err != nil {
			b.Fatal(err)
		}
		if err := claims[i].script.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		cpu[i], _ = (&redisMeter{c: c}).read(b)
	}
	var next int64
	for b.Loop() {
		for _, cl := range claims {
			if err := cl.batch(ctx, next, n); err != nil {
				b.Fatal(err)
			}
		}
		next += int64(n)
	}
	for i, v := range variants {
		after, usec := (&redisMeter{c: claims[i].c}).read(b)
		b.ReportMetric(usec/float64(b.N), v.name+"-us/call")
		if opts.AOF {
			b.ReportMetric((after-cpu[i])/float64(b.N), v.name+"-cpu-us/call")
		}
	}
}

// plainClaimSrc is what claim_many writes for a batch of new users on an
// open sub-pool, in the batch forms (--outbox batch --deadline-index
// batch), written plainly in claim_many's KEYS, ARGV and answers: one read
// of the meta with its counters, the clock, the users' grants, one pop,
// the grants' records, one outbox entry, one deadline index member, the
// counters. Not rain's: no prelude (no probe of a moving slot), no expiry,
// resend, window, spill, fence or precision checks, and stock popped that
// no claim took is lost. BenchmarkBatchFixedCost runs it to measure what
// claim_many's own work costs beyond these writes (docs/benchmarks.md,
// "The open loop's floor").
const plainClaimSrc = `
local n = (#ARGV - 3) / 3
local m = redis.call('HMGET', KEYS[1], 'state', 'hold_ms', 'version', 'stock_count', 'stock_cents', 'held_count', 'held_cents', 'batched_users')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = string.format('%d', now + tonumber(m[2]))
local users = {}
for i = 1, n do users[i] = ARGV[3 * i + 1] end
local held = redis.call('HMGET', KEYS[3], unpack(users))
local popped = redis.call('LPOP', KEYS[2], n) or {}
local out, records, entry, members = {}, {}, {}, {}
local used, cents = 0, 0
for i = 1, n do
  local user, serial = users[i], ARGV[3 * i + 2]
  if held[i] then
    out[i] = {'already', 0, tonumber(serial), 0}
  else
    used = used + 1
    local a = popped[used]
    if a == nil then
      out[i] = {'empty'}
    else
      cents = cents + tonumber(a)
      records[#records + 1] = user
      records[#records + 1] = 'h:' .. a .. ':' .. serial .. ':' .. deadline
      entry[#entry + 1] = a .. ':' .. serial .. ':' .. deadline .. ':' .. user
      members[#members + 1] = user
      out[i] = {'granted', tonumber(a), tonumber(serial), tonumber(deadline)}
    end
  end
end
if #members > 0 then
  redis.call('HSET', KEYS[3], unpack(records))
  redis.call('XADD', KEYS[5], '*', 'G', table.concat(entry, ' '))
  local batched = tonumber(m[8]) or 0
  if #members == 1 then
    redis.call('ZADD', KEYS[4], deadline, members[1])
  else
    redis.call('ZADD', KEYS[7], deadline, table.concat(members, ' '))
    batched = batched + #members
  end
  redis.call('HSET', KEYS[1], 'version', string.format('%d', (tonumber(m[3]) or 0) + 1),
    'stock_count', string.format('%d', tonumber(m[4]) - #members), 'stock_cents', string.format('%d', tonumber(m[5]) - cents),
    'held_count', string.format('%d', tonumber(m[6]) + #members), 'held_cents', string.format('%d', tonumber(m[7]) + cents),
    'batched_users', string.format('%d', batched))
end
return out
`

// editedClaimMany is claim_many as rain runs it with each edits[i] (once in
// it, or the benchmark fails: it would measure the script unchanged)
// replaced by edits[i+1].
func editedClaimMany(b *testing.B, edits []string) string {
	b.Helper()
	src := prelude + source("claim_many")
	for i := 0; i < len(edits); i += 2 {
		if strings.Count(src, edits[i]) != 1 {
			b.Fatalf("the script no longer holds %q once: update the variant", edits[i])
		}
		src = strings.Replace(src, edits[i], edits[i+1], 1)
	}
	return src
}

// claimer sends one batch of n claims of new users and checks that each
// was granted; refill gives it fresh stock for at least `packets` more.
type claimer interface {
	batch(ctx context.Context, first int64, n int) error
	refill(ctx context.Context, packets int64) error
}

// benchPackets is the stock loaded at a time: b.Loop's ramp may ask for
// more, which a refill outside the measurement adds.
const benchPackets = 200_000

func benchClaims(b *testing.B, n int, newClaimer func(*redis.Client) claimer) {
	ctx := context.Background()
	srv := redistest.Start(b, redistest.Options{AOF: true, Fsync: "always"})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { c.Close() })
	cl := newClaimer(c)
	if err := cl.refill(ctx, benchPackets); err != nil {
		b.Fatal(err)
	}
	m := &redisMeter{c: c}
	left := int64(benchPackets)
	var next int64
	m.start(b)
	for b.Loop() {
		if left < int64(n) {
			b.StopTimer()
			m.pause(b)
			if err := cl.refill(ctx, benchPackets); err != nil {
				b.Fatal(err)
			}
			left = benchPackets
			m.start(b)
			b.StartTimer()
		}
		if err := cl.batch(ctx, next, n); err != nil {
			b.Fatal(err)
		}
		next += int64(n)
		left -= int64(n)
	}
	m.pause(b)
	claims := float64(next)
	b.ReportMetric(m.cpuUS/claims, "redis-us/claim")
	b.ReportMetric(m.luaUS/claims, "lua-us/claim")
	b.ReportMetric(m.cpuUS/float64(b.N), "redis-us/batch")
	b.ReportMetric(claims/(m.cpuUS/1e6), "grants/s/core")
	b.ReportMetric(claims/b.Elapsed().Seconds(), "claims/s")
}

// redisMeter adds up Redis's CPU and its scripts' time over the measured
// stretches, from INFO.
type redisMeter struct {
	c            *redis.Client
	cpu0, lua0   float64 // at the start of the stretch, µs
	cpuUS, luaUS float64 // over the stretches so far
}

func (m *redisMeter) start(b *testing.B) { m.cpu0, m.lua0 = m.read(b) }

func (m *redisMeter) pause(b *testing.B) {
	cpu, lua := m.read(b)
	m.cpuUS += cpu - m.cpu0
	m.luaUS += lua - m.lua0
}

// read returns used_cpu_sys + used_cpu_user and evalsha's usec, in µs.
func (m *redisMeter) read(b *testing.B) (cpu, lua float64) {
	b.Helper()
	info, err := m.c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO %s: %v", line, err)
			}
			cpu += f * 1e6
		case "cmdstat_evalsha":
			for kv := range strings.SplitSeq(v, ",") {
				if name, val, _ := strings.Cut(kv, "="); name == "usec" {
					f, err := strconv.ParseFloat(val, 64)
					if err != nil {
						b.Fatalf("INFO %s: %v", line, err)
					}
					lua = f
				}
			}
		}
	}
	return cpu, lua
}

// benchForm is the form BenchmarkClaimMany claims in: what scripts/bench.sh
// runs rain serve with (--outbox batch --deadline-index batch).
var benchForm = Form{Outbox: OutboxBatch, BatchedDeadlines: true}

// rainClaims sends claim_many batches, as the lane does.
type rainClaims struct {
	c      *redis.Client
	sub    int // sub-pools made so far; the latest is where claims go
	keys   rain.Keys
	claims []ClaimArg
	form   Form
	script *redis.Script // claim_many as rain runs it when nil; else a variant (BenchmarkNextLevers)
}

func newRainClaims(c *redis.Client) claimer { return &rainClaims{c: c, form: benchForm} }

func (r *rainClaims) refill(ctx context.Context, packets int64) error {
	sp := rain.SubPool{Pool: "bench", Index: r.sub}
	r.sub++
	if _, _, err := Setup(ctx, r.c, sp, packets, packets*100, Window{HoldMS: 3_600_000}); err != nil {
		return err
	}
	if err := LoadScripts(ctx, r.c); err != nil {
		return err
	}
	if r.script != nil {
		if err := r.script.Load(ctx, r.c).Err(); err != nil {
			return err
		}
	}
	amounts := make([]int64, 1000)
	for i := range amounts {
		amounts[i] = 100
	}
	pipe := r.c.Pipeline()
	var cmds []*redis.Cmd
	for batch := int64(0); batch*1000 < packets; batch++ {
		cmds = append(cmds, LoadCmd(ctx, pipe, sp, batch, amounts[:min(1000, packets-batch*1000)]))
		if pipe.Len() == 16 || (batch+1)*1000 >= packets {
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
		}
	}
	for _, cmd := range cmds {
		if res, _, err := ParseLoad(cmd); err != nil || res != Loaded {
			return fmt.Errorf("load: %v %v", res, err)
		}
	}
	if ok, _, _, err := OpenSubPool(ctx, r.c, sp); err != nil || !ok {
		return fmt.Errorf("open %s: %v %v", sp.Tag(), ok, err)
	}
	r.keys = sp.Keys()
	return nil
}

func (r *rainClaims) batch(ctx context.Context, first int64, n int) error {
	r.claims = r.claims[:0]
	for i := range int64(n) {
		r.claims = append(r.claims, ClaimArg{User: "u" + strconv.FormatInt(first+i, 10), Serial: first + i + 1})
	}
	pipe := r.c.Pipeline()
	var cmd *redis.Cmd
	if r.script == nil {
		cmd = ClaimManyCmd(ctx, pipe, &r.keys, 0, false, r.form, r.claims, nil)
	} else {
		cmd = r.script.EvalSha(ctx, pipe, claimKeys(&r.keys), claimManyArgs(nil, 0, false, r.form, r.claims)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	claims, errs, err := ParseClaimMany(cmd, n)
	if err != nil {
		return err
	}
	for i, cl := range claims {
		if errs[i] != nil || cl.Outcome != Granted {
			return fmt.Errorf("claim of %s = %+v, %v; want granted", r.claims[i].User, cl, errs[i])
		}
	}
	return nil
}

// minimalClaims sends a pipeline of one minimal script per claim.
type minimalClaims struct {
	c      *redis.Client
	script *redis.Script
	keys   []string
	cmds   []*redis.Cmd
}

func newMinimalClaims(c *redis.Client) claimer {
	return &minimalClaims{c: c, script: redis.NewScript(minimal.ClaimSrc), keys: minimal.Keys("bench")}
}

func (m *minimalClaims) refill(ctx context.Context, packets int64) error {
	if err := m.script.Load(ctx, m.c).Err(); err != nil {
		return err
	}
	return minimal.Stock(ctx, m.c, m.keys, 1, minimal.Same(packets, 100))
}

func (m *minimalClaims) batch(ctx context.Context, first int64, n int) error {
	pipe := m.c.Pipeline()
	m.cmds = m.cmds[:0]
	for i := range int64(n) {
		m.cmds = append(m.cmds, m.script.EvalSha(ctx, pipe, m.keys, "u"+strconv.FormatInt(first+i, 10)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for _, cmd := range m.cmds {
		if res, err := cmd.Int64Slice(); err != nil || len(res) != 2 || res[0] != 2 {
			return fmt.Errorf("minimal claim = %v, %v; want granted", res, err)
		}
	}
	return nil
}
