package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

func writeSecret(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func userToken(t *testing.T, key, sub string) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Minute).Unix()}).SignedString([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func grabWith(t *testing.T, base, bearer, body string) (int, map[string]any) {
	t.Helper()
	return post(t, base+"/grab", bearer, body)
}

// TestServeSecrets: rain serve with admin tokens from a file and user auth
// from a key file; SIGHUP rotates both: a token added works at once, a
// token removed stops working, a new signing key replaces the old. A file
// with a bad line never keeps a removed token alive: the reload says what
// is wrong, and the file's good lines are the tokens in use.
func TestServeSecrets(t *testing.T) {
	dir := t.TempDir()
	admins, key := filepath.Join(dir, "admins"), filepath.Join(dir, "user.key")
	tokA, tokB, tokC := "3f7a9c1e05b2d84f6a1c9e3b70d2f5a8", "b81e4d7c2a90f35e6b18d4c7a2093f5e", "6c2f9a0e4d7b1835c9e2f0a6d4b7183c"
	k1, k2 := strings.Repeat("1", 32), strings.Repeat("2", 32)
	writeSecret(t, admins, "# rotation file\n"+tokA+"\n")
	writeSecret(t, key, k1+"\n")
	addr, logs := startServe(t, []string{"--admin-token-file", admins, "--user-auth", "hs256:" + key}, nil)
	base := "http://" + addr
	if strings.Contains(logs.String(), "admin_token=") {
		t.Fatal("a generated admin token was printed although a token file was given")
	}
	preload := func(tok, id string) int {
		code, _ := post(t, base+"/admin/pools", tok, `{"pool_id":"`+id+`","total_cents":1000,"count":10}`)
		return code
	}
	if code := preload(tokA, "p"); code != 201 {
		t.Fatalf("preload with the file's token = %d, want 201", code)
	}
	if code := preload(tokB, "q"); code != 401 {
		t.Fatalf("preload with a token not in the file = %d, want 401", code)
	}
	if code, body := grabWith(t, base, "", `{"pool_id":"p","user_id":"alice"}`); code != 401 || body["status"] != "unauthorized" {
		t.Fatalf("grab without a user token = %d %v, want 401 unauthorized", code, body)
	}
	if code, body := grabWith(t, base, userToken(t, k1, "alice"), `{"pool_id":"p"}`); code != 200 || body["user_id"] != "alice" {
		t.Fatalf("grab with a user token = %d %v, want granted to alice", code, body)
	}

	// Rotation, step 1: add B (both work); new signing key.
	writeSecret(t, admins, tokA+"\n"+tokB+"\n")
	writeSecret(t, key, k2)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// Until the reload, token B is refused (401); then its preload loads q
	// (201), or finds q loaded by a try whose answer came too late for the
	// shard's deadline on a busy machine (200).
	waittest.Until(t, 30*time.Second, "token B accepted after SIGHUP", func() bool {
		code := preload(tokB, "q")
		if code != 401 && code != 201 && code != 200 {
			t.Logf("preload with token B after SIGHUP = %d; trying again", code)
		}
		return code == 201 || code == 200
	})
	if code := preload(tokA, "p"); code != 200 {
		t.Fatalf("token A during the rotation = %d, want 200 (pool already loaded)", code)
	}
	if code, _ := grabWith(t, base, userToken(t, k1, "bob"), `{"pool_id":"p"}`); code != 401 {
		t.Fatalf("a token of the old signing key after the reload = %d, want 401", code)
	}
	if code, _ := grabWith(t, base, userToken(t, k2, "bob"), `{"pool_id":"p"}`); code != 200 {
		t.Fatalf("a token of the new signing key = %d, want 200", code)
	}
	// Step 2: remove A. A bad file keeps what was loaded.
	writeSecret(t, admins, tokB+"\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "token A refused after SIGHUP", func() bool { return preload(tokA, "p") == 401 })
	// Step 3: B leaked; the operator revokes it, swaps in C, and a typo
	// lands in the file with them.
	writeSecret(t, admins, "short\n"+tokC+"\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "the failed reload logged", func() bool { return strings.Contains(logs.String(), "reload failed") })
	if code := preload(tokB, "q"); code != 401 {
		t.Fatalf("token B, taken out of the file, after a reload that met a bad line = %d, want 401 (revoked)", code)
	}
	if code := preload(tokC, "q"); code != 200 {
		t.Fatalf("token C, a good line beside the bad one = %d, want 200", code)
	}
	if !strings.Contains(logs.String(), "line 1") {
		t.Errorf("the failed reload does not name the bad line:\n%s", logs)
	}
}

// TestServeTLSShards: rain serve, the preload tool and the audit tool on a
// shard reached over TLS with AUTH (rediss://user:password@...,
// --redis-ca), as production runs them (appendfsync always).
func TestServeTLSShards(t *testing.T) {
	tl := redistest.NewTLS(t)
	opts := durable
	opts.Args = append(tl.Args, "--requirepass", "default-pw", "--user", "rain", "on", ">rain-pw", "~*", "&*", "+@all")
	redistest.Start(t, opts)
	environ := map[string]string{
		"RAIN_REDIS":       fmt.Sprintf("s1=1@rediss://rain:rain-pw@127.0.0.1:%d", tl.Port),
		"RAIN_REDIS_CA":    tl.CAFile,
		"RAIN_ADMIN_TOKEN": longToken,
	}
	addr, logs := startServe(t, nil, environ)
	if strings.Contains(logs.String(), "rain-pw") {
		t.Fatalf("the shard password is in the logs:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "user auth is off") {
		t.Errorf("no warning that user auth is off on real shards:\n%s", logs)
	}
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", longToken, `{"pool_id":"t","total_cents":1000,"count":10}`); code != 201 {
		t.Fatalf("preload over TLS = %d %v", code, body)
	}
	if code, body := post(t, base+"/grab", "", `{"pool_id":"t","user_id":"u1"}`); code != 200 {
		t.Fatalf("grab over TLS = %d %v", code, body)
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"audit", "--pool", "t"}, env(environ), &out, &errOut); err != nil {
		t.Fatalf("rain audit over TLS: %v\n%s%s", err, out.String(), errOut.String())
	}
	bad := map[string]string{"RAIN_REDIS": environ["RAIN_REDIS"], "RAIN_ADMIN_TOKEN": longToken}
	if err := run(context.Background(), []string{"audit", "--pool", "t"}, env(bad), &out, &errOut); err == nil {
		t.Fatal("audit without the CA trusted the shard's self-signed certificate")
	}
}

// TestSecretFlagsWarned: a secret given as a flag (the admin token, a
// password in --redis, --postgres or --webhook) shows in the process list:
// every command warns of it, naming the flag and its variable, never the
// secret; the same secret from the variable is not warned of.
func TestSecretFlagsWarned(t *testing.T) {
	const warning = "on the command line: every user of the host can read it"
	_, logs := startServe(t, []string{"--admin-token", longToken}, nil)
	if !strings.Contains(logs.String(), "--admin-token "+warning) || !strings.Contains(logs.String(), "RAIN_ADMIN_TOKEN") {
		t.Errorf("rain serve --admin-token: no warning naming the flag and RAIN_ADMIN_TOKEN:\n%s", logs)
	}
	if strings.Contains(logs.String(), longToken) {
		t.Errorf("rain serve logged the admin token:\n%s", logs)
	}
	_, logs = startServe(t, nil, map[string]string{"RAIN_ADMIN_TOKEN": longToken})
	if strings.Contains(logs.String(), warning) {
		t.Errorf("rain serve with RAIN_ADMIN_TOKEN warned of a flag:\n%s", logs)
	}

	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"audit", "--redis", "s1=1@redis://:hunter2@127.0.0.1:1", "--pool", "p"}, "--redis"},
		{[]string{"end", "--redis", "s1=1@sentinel/rain:hunter2@m/127.0.0.1:1", "--pool", "p"}, "--redis"},
		{[]string{"end", "--redis", "s1=1@sentinel+tls/:hunter2@m/127.0.0.1:1", "--pool", "p"}, "--redis"},
		{[]string{"end", "--redis", "c1=1@cluster/rain:hunter2@127.0.0.1:1+127.0.0.1:2", "--pool", "p"}, "--redis"},
		{[]string{"audit", "--redis", "s1=1@127.0.0.1:3,c1=1@cluster+tls/:hunter2@127.0.0.1:1", "--pool", "p"}, "--redis"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--postgres", "postgres://rain:hunter2@127.0.0.1:1/rain?sslmode=verify-full"}, "--postgres"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--webhook", "https://rain:hunter2@wallet.example/credit"}, "--webhook"},
	} {
		var out logtest.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // settle waits for its shards
		_ = run(ctx, c.args, env(nil), &out, &out)
		cancel()
		if !strings.Contains(out.String(), c.flag+" "+warning) {
			t.Errorf("rain %v: no warning about %s:\n%s", c.args, c.flag, out.String())
		}
		if strings.Contains(out.String(), "hunter2") {
			t.Errorf("rain %v printed the password:\n%s", c.args, out.String())
		}
	}
	var out bytes.Buffer
	_ = run(context.Background(), []string{"audit", "--pool", "p"}, env(map[string]string{"RAIN_REDIS": "s1=1@redis://:hunter2@127.0.0.1:1"}), &out, &out)
	if strings.Contains(out.String(), warning) {
		t.Errorf("rain audit with RAIN_REDIS warned of a flag:\n%s", out.String())
	}
}

// TestSettleWebhookURL: rain settle refuses an http:// wallet URL unless
// --webhook-allow-http says so (then it warns), and never logs the URL's
// password or query (a wallet's key may ride in either).
func TestSettleWebhookURL(t *testing.T) {
	srv := redistest.Start(t, durable)
	shards := "s1=1@" + srv.Addr
	err := run(context.Background(), []string{"settle", "--redis", shards, "--webhook", "http://wallet.example/credit"}, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--webhook-allow-http") {
		t.Fatalf("rain settle --webhook http://... = %v, want refused, naming --webhook-allow-http", err)
	}
	for _, c := range []struct {
		environ map[string]string
		warn    string
	}{
		{map[string]string{"RAIN_WEBHOOK": "https://rain:hunter2@wallet.example/credit?key=k3y"}, ""},
		{map[string]string{"RAIN_WEBHOOK": "http://rain:hunter2@127.0.0.1:1/credit?key=k3y", "RAIN_WEBHOOK_ALLOW_HTTP": "true"}, "webhook over plain http"},
	} {
		c.environ["RAIN_REDIS"] = shards
		logs := &logtest.Buffer{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, []string{"settle", "--consumer", "t"}, env(c.environ), &bytes.Buffer{}, logs) }()
		waittest.Until(t, 10*time.Second, "rain settle settling", func() bool { return strings.Contains(logs.String(), "msg=settling") })
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("rain settle: %v", err)
		}
		if strings.Contains(logs.String(), "hunter2") || strings.Contains(logs.String(), "k3y") {
			t.Errorf("rain settle logged the webhook's password or query:\n%s", logs)
		}
		if c.warn != "" && !strings.Contains(logs.String(), c.warn) {
			t.Errorf("rain settle with --webhook-allow-http did not warn %q:\n%s", c.warn, logs)
		}
	}
}

// TestUserAuthOnRealShards: on real shards rain serve with no word on
// user auth runs as the contract's command line has it (API.md: user auth
// is optional), and says loudly that any client can grab as anyone: in its
// log and in /readyz's answer to an operator; --user-auth none says so
// too. With user auth on, a token whose aud or iss is not checked is
// warned of the same way, until both are given.
func TestUserAuthOnRealShards(t *testing.T) {
	srv := redistest.Start(t, durable)
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + srv.Addr, "RAIN_ADMIN_TOKEN": longToken}
	key := filepath.Join(t.TempDir(), "user.key")
	writeSecret(t, key, strings.Repeat("k", 32))
	for _, c := range []struct {
		args []string
		want []string // warnings, in the log and /readyz
	}{
		{nil, []string{warnUserAuthUnset}},
		{[]string{"--user-auth", "none"}, []string{warnUserAuthOff}},
		{[]string{"--user-auth", "hs256:" + key}, []string{warnNoAudience, warnNoIssuer}},
		{[]string{"--user-auth", "hs256:" + key, "--user-auth-audience", "rain", "--user-auth-issuer", "https://login.example"}, nil},
	} {
		e := environ
		if c.args == nil { // no word on user auth (startServe's default is none)
			e = map[string]string{"RAIN_USER_AUTH": ""}
			maps.Copy(e, environ)
		}
		addr, logs := startServe(t, c.args, e)
		code, body := get(t, "http://"+addr+"/readyz", longToken)
		var rd struct {
			Warnings []string `json:"warnings"`
		}
		_ = json.Unmarshal([]byte(body), &rd)
		if code != 200 || !slices.Equal(rd.Warnings, c.want) {
			t.Errorf("rain serve %v: /readyz for the operator = %d, warnings %q; want 200, %q", c.args, code, rd.Warnings, c.want)
		}
		for _, w := range c.want {
			if !strings.Contains(logs.String(), w) {
				t.Errorf("rain serve %v did not log %q", c.args, w)
			}
		}
		if _, body := get(t, "http://"+addr+"/readyz", ""); body != "{\"ready\":true}\n" {
			t.Errorf("rain serve %v: /readyz for anyone = %q, want {\"ready\":true} alone", c.args, body)
		}
	}
}

// TestPostgresTLS: a --postgres link that falls back to plain text without
// a word (sslmode prefer, pgx's default, or allow) is refused, saying what
// to give; one in plain text to another host, or encrypted to a server
// whose certificate is not checked, is warned of; plain text to this host,
// or a checked certificate, is neither.
func TestPostgresTLS(t *testing.T) {
	const far = "192.0.2.1:5432" // TEST-NET: no database answers, quickly
	for _, c := range []struct {
		url, refused, warned string
	}{
		{"postgres://rain@" + far + "/rain?connect_timeout=1", "sslmode prefer", ""},
		{"postgres://rain@" + far + "/rain?sslmode=prefer&connect_timeout=1", "sslmode prefer", ""},
		{"postgres://rain@" + far + "/rain?sslmode=allow&connect_timeout=1", "sslmode prefer", ""},
		{"host=192.0.2.1 user=rain dbname=rain connect_timeout=1", "sslmode prefer", ""},
		{"postgres://rain@" + far + "/rain?sslmode=disable&connect_timeout=1", "", "plain text"},
		{"postgres://rain@" + far + "/rain?sslmode=require&connect_timeout=1", "", "checks no certificate"},
		{"postgres://rain@127.0.0.1:1/rain?sslmode=disable&connect_timeout=1", "", ""},
		{"host=/run/postgresql user=rain sslmode=disable connect_timeout=1", "", ""},
		{"postgres://rain@" + far + "/rain?sslmode=verify-full&connect_timeout=1", "", ""},
	} {
		var out logtest.Buffer
		err := run(context.Background(), []string{"close", "--redis", "s1=1@127.0.0.1:1", "--pool", "p", "--postgres", c.url}, env(nil), &out, &out)
		refused := err != nil && exitCode(err) == exitUsage
		switch {
		case c.refused != "" && (!refused || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("rain close --postgres %q = %v, want a usage error saying %q", c.url, err, c.refused)
		case c.refused == "" && refused:
			t.Errorf("rain close --postgres %q = %v, want it tried", c.url, err)
		case c.warned != "" && !strings.Contains(out.String(), c.warned):
			t.Errorf("rain close --postgres %q warned %q, want %q", c.url, out.String(), c.warned)
		case c.warned == "" && strings.Contains(out.String(), "warning: --postgres"):
			t.Errorf("rain close --postgres %q warned %q, want nothing", c.url, out.String())
		}
	}
}

// TestEmbeddedOnEveryInterface: the try-it mode listening beyond this host
// (its admin token is in its log) says so loudly; on loopback it does not.
func TestEmbeddedOnEveryInterface(t *testing.T) {
	for _, c := range []struct {
		listen string
		warn   bool
	}{{"0.0.0.0:0", true}, {"127.0.0.1:0", false}} {
		logs := &logtest.Buffer{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, []string{"serve", "--listen", c.listen, "--drain-delay", "0"}, env(nil), &bytes.Buffer{}, logs)
		}()
		waittest.Until(t, 10*time.Second, "rain serve serving", func() bool { return strings.Contains(logs.String(), "msg=serving") })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), warnEmbeddedExposed); got != c.warn {
			t.Errorf("rain serve --listen %s (embedded): warned that it is exposed = %v, want %v\n%s", c.listen, got, c.warn, logs)
		}
	}
}
