package rain

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestKeysShareOneTag(t *testing.T) {
	for _, tc := range []struct {
		sp  SubPool
		tag string
	}{
		{SubPool{Pool: "cny:2027.a-b_c", Index: 7}, "{cny:2027.a-b_c:7}"},
		{SubPool{Pool: "cny:2027.a-b_c", Index: 7, Salt: "42"}, "{cny:2027.a-b_c:7~42}"},
	} {
		k := tc.sp.Keys()
		// All lists every field of Keys, each once.
		v := reflect.ValueOf(k)
		var fields []string
		for i := range v.NumField() {
			fields = append(fields, v.Field(i).String())
		}
		if all := k.All(); !slices.Equal(slices.Sorted(slices.Values(all)), slices.Sorted(slices.Values(fields))) {
			t.Fatalf("Keys.All() = %q, want every field of Keys once: %q", all, fields)
		}
		if got := tc.sp.Tag(); got != tc.tag {
			t.Fatalf("%+v.Tag() = %q, want %q", tc.sp, got, tc.tag)
		}
		for _, key := range k.All() {
			if !strings.Contains(key, tc.tag) || strings.Count(key, "{") != 1 {
				t.Fatalf("key %q does not carry exactly the tag %s", key, tc.tag)
			}
		}
	}
}

// TestKeyNamesAreData: a key's name is what a running pool's data is
// stored under, so renaming a Go field must not rename its key: a rain
// upgraded under a live pool would not find what the older one wrote. The
// resolved transfers keep the name "settled" on purpose.
func TestKeyNamesAreData(t *testing.T) {
	k := SubPool{Pool: "p", Index: 3}.Keys()
	salted := SubPool{Pool: "p", Index: 3, Salt: "17"}.Keys()
	for _, tc := range []struct{ got, want string }{
		{k.Meta, "rain:{p:3}:meta"},
		{k.Stock, "rain:{p:3}:stock"},
		{k.Grants, "rain:{p:3}:grants"},
		{k.Deadlines, "rain:{p:3}:deadlines"},
		{k.Outbox, "rain:{p:3}:outbox"},
		{k.Reserve, "rain:{p:3}:reserve"},
		{k.Transfers, "rain:{p:3}:transfers"},
		{k.Resolved, "rain:{p:3}:settled"},
		{k.Verdicts, "rain:{p:3}:verdicts"},
		{salted.Meta, "rain:{p:3~17}:meta"},
		{salted.Outbox, "rain:{p:3~17}:outbox"},
		{salted.Resolved, "rain:{p:3~17}:settled"},
	} {
		if tc.got != tc.want {
			t.Errorf("key %q, want %q (the name earlier versions wrote)", tc.got, tc.want)
		}
	}
}

// TestParseKeys: a sub-pool's outbox and meta keys name it back, salt and
// all; other keys name none.
func TestParseKeys(t *testing.T) {
	for _, sp := range []SubPool{{Pool: "p", Index: 0}, {Pool: "cny:2027.a-b_c", Index: 12, Salt: "905"}} {
		k := sp.Keys()
		if got, ok := ParseOutbox(k.Outbox); !ok || got != sp {
			t.Errorf("ParseOutbox(%q) = %+v, %v, want %+v", k.Outbox, got, ok, sp)
		}
		if got, ok := ParseMeta(k.Meta); !ok || got != sp {
			t.Errorf("ParseMeta(%q) = %+v, %v, want %+v", k.Meta, got, ok, sp)
		}
		if _, ok := ParseOutbox(k.Meta); ok {
			t.Errorf("ParseOutbox(%q): ok, want not an outbox", k.Meta)
		}
	}
	for _, key := range []string{"", "rain:pools", "rain:{p}:pool", "rain:{due}:at", "rain:{p:01}:outbox", "rain:{p:-1}:outbox", "rain:{:1}:outbox", "x:{p:1}:outbox"} {
		if sp, ok := ParseOutbox(key); ok {
			t.Errorf("ParseOutbox(%q) = %+v, want none", key, sp)
		}
	}
}
