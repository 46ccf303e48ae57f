package shard

import (
	"errors"
	"testing"
)

// TestSerialShard: the serial shard is the one named, or the first listed
// (not the first by name), and a name that is none of the shards is
// refused by SerialOf and Open alike, never swapped for another shard.
func TestSerialShard(t *testing.T) {
	specs := []Spec{{Name: "b", Weight: 1, Addr: "127.0.0.1:1"}, {Name: "a", Weight: 1, Addr: "127.0.0.1:2"}}
	for _, c := range []struct {
		name, want string
		err        error
	}{
		{"", "b", nil}, // the first listed, though "a" sorts first
		{"a", "a", nil},
		{"b", "b", nil},
		{"c", "", ErrUnknownSerial},
	} {
		t.Run("serial="+c.name, func(t *testing.T) {
			got, err := SerialOf(specs, c.name)
			if got != c.want || !errors.Is(err, c.err) {
				t.Fatalf("SerialOf(%q) = %q, %v; want %q, %v", c.name, got, err, c.want, c.err)
			}
			set, err := Open(specs, 0, Options{Serial: c.name})
			if c.err != nil {
				if !errors.Is(err, c.err) || set != nil {
					t.Fatalf("Open(Serial %q) = %v, %v; want nil, %v", c.name, set, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer set.Close()
			if set.Serial() != c.want {
				t.Fatalf("Open(Serial %q).Serial() = %q, want %q", c.name, set.Serial(), c.want)
			}
		})
	}
}
