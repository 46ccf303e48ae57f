package timeline

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRead(t *testing.T) {
	in := `{"t":0,"offered":10,"statuses":{"granted":9},"p99_ms":1.5,"remaining_count":5}

{"t":1,"offered":20,"gauges":{"rain_pool_capacity":8}}
`
	ss, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || ss[0].Statuses["granted"] != 9 || ss[0].P99Ms != 1.5 || *ss[0].RemainingCount != 5 ||
		ss[1].T != 1 || ss[1].RemainingCount != nil || ss[1].Gauges["rain_pool_capacity"] != 8 {
		t.Errorf("Read = %+v", ss)
	}
	if _, err := Read(strings.NewReader("{\"t\":0}\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("Read(bad line 2) = %v, want an error naming line 2", err)
	}
}
