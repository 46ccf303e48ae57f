package api

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestContractDocument: docs/api.md, the contract clients read, names every
// status of POST /grab with the code the server answers it with, and every
// reason text of a 503, word for word: the document and the server cannot
// drift apart unnoticed.
func TestContractDocument(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([0-9]{3}) \\|")
	documented := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		code, _ := strconv.Atoi(m[2])
		documented[m[1]] = code
	}
	for st := range stError { // every status of the contract; stError is not one
		t.Run(st.String(), func(t *testing.T) {
			if code, ok := documented[st.String()]; !ok || code != st.code() {
				t.Errorf("docs/api.md documents %s as %d (%v), the server answers %d", st, code, ok, st.code())
			}
		})
	}
	if len(documented) != int(stError) {
		t.Errorf("docs/api.md's status table has %d rows, the server %d statuses", len(documented), stError)
	}
	flat := strings.Join(strings.Fields(doc), " ")
	for rs := range nReason {
		if text := rs.text(); !strings.Contains(flat, text) {
			t.Errorf("docs/api.md does not give the 503 reason %q", text)
		}
	}
}
