package crowdsec

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkDecode1M reads a startup answer of 1M decisions written as
// CrowdSec 1.4.6's LAPI writes them (field order and all).
func BenchmarkDecode1M(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"deleted":null,"new":[`)
	for i := range 1_000_000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"duration":"3h59m59.%06ds","id":%d,"origin":"cscli-import","scenario":"manual import","scope":"Ip","type":"ban","value":"%d.%d.%d.%d"}`,
			i%1000000, i+1, 1+i>>24, i>>16&255, i>>8&255, i&255)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	c := &Client{Scopes: []string{"ip", "range"}}
	for b.Loop() {
		a, err := c.decode(body, time.Now(), true)
		if err != nil || len(a.New) != 1_000_000 {
			b.Fatal(err, len(a.New))
		}
	}
}
