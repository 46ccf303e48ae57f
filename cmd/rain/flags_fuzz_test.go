package main

import (
	"bytes"
	"flag"
	"testing"
)

// FuzzServeFlags: any value of any of rain serve's flags, on the command
// line or in its environment variable, is taken or refused as a usage
// error (exit 2), never a panic; the variable takes what the flag takes,
// to the same value; and a log level or format taken makes a logger.
func FuzzServeFlags(f *testing.F) {
	for i, v := range []string{"", "1", "-1", "auto", "1h", "on", "s1=1@127.0.0.1:7001", "debug", "json", "x\x00y", "99999999999999999999"} {
		f.Add(uint8(i), v)
		f.Add(uint8(i*7), v)
	}
	var names []string
	fs, _ := serveFlags(&bytes.Buffer{})
	fs.VisitAll(func(fl *flag.Flag) { names = append(names, fl.Name) })
	f.Fuzz(func(t *testing.T, which uint8, value string) {
		name := names[int(which)%len(names)]
		fa, ca := serveFlags(&bytes.Buffer{})
		errArg := fa.parse([]string{"--" + name + "=" + value}, env(nil))
		if errArg != nil && exitCode(errArg) != exitUsage {
			t.Fatalf("--%s=%q: %v (exit %d), want a usage error", name, value, errArg, exitCode(errArg))
		}
		if errArg == nil {
			if _, err := ca.Log.newLogger(&bytes.Buffer{}); err != nil && name != "log-level" && name != "log-format" {
				t.Fatalf("--%s=%q made the default logger fail: %v", name, value, err)
			}
		}
		fe, _ := serveFlags(&bytes.Buffer{})
		v, ok := fe.env[name]
		if !ok || value == "" { // an empty variable is no value
			return
		}
		errEnv := fe.parse(nil, env(map[string]string{v: value}))
		if errEnv != nil && exitCode(errEnv) != exitUsage {
			t.Fatalf("%s=%q: %v (exit %d), want a usage error", v, value, errEnv, exitCode(errEnv))
		}
		if (errArg == nil) != (errEnv == nil) {
			t.Fatalf("--%s=%q: %v; %s=%q: %v; want both taken or both refused", name, value, errArg, v, value, errEnv)
		}
		if errArg == nil && fa.Lookup(name).Value.String() != fe.Lookup(name).Value.String() {
			t.Fatalf("--%s=%q sets %q, %s sets %q", name, value, fa.Lookup(name).Value.String(), v, fe.Lookup(name).Value.String())
		}
	})
}
