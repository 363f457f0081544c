package wire

import (
	"bytes"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

// The fuzz tests run their seeds (f.Add and testdata/fuzz/<name>) with
// go test; scripts/test or `go test -fuzz=FuzzParse ./wire` explores.

// roundTrip encodes h as a NATS header block, as nats.go sends it, and
// decodes it as nats.go reads it.
func roundTrip(t *testing.T, h map[string][]string) map[string][]string {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			// nats.go's writeHeaderValue: trimmed, CR and LF as spaces.
			v = strings.NewReplacer("\r", " ", "\n", " ").Replace(strings.Trim(v, " \t\r\n"))
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	got, err := nats.DecodeHeadersMsg(b.Bytes())
	if err != nil {
		t.Fatalf("header block %q does not decode: %v", b.Bytes(), err)
	}
	return got
}

// kvKey is nats.go's rule for a KV key, plus the server's: no empty
// subject token.
var kvKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func FuzzValidateJobID(f *testing.F) {
	for _, s := range []string{"order-1", "order..1", "a.b", ".a", "a.", "order 1", strings.Repeat("x", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidateJobID(id) != nil {
			return
		}
		if !kvKey.MatchString(id) || strings.HasPrefix(id, ".") || strings.HasSuffix(id, ".") || strings.Contains(id, "..") {
			t.Fatalf("accepted %q, which the results bucket cannot hold", id)
		}
		if got := roundTrip(t, map[string][]string{HeaderJobID: {id}})[HeaderJobID]; len(got) != 1 || got[0] != id {
			t.Fatalf("ID %q arrives as %q", id, got)
		}
	})
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"sku:7", "sku:7 ", " sku:7", "sku\t7", "siège A7", "a\r\nb", "\u00a0k", "k\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if ValidateKey(key) != nil {
			return
		}
		if got := roundTrip(t, map[string][]string{HeaderKey: {key}})[HeaderKey]; len(got) != 1 || got[0] != key {
			t.Fatalf("key %q arrives as %q: the worker would read another key", key, got)
		}
	})
}

func FuzzValidateUserHeader(f *testing.F) {
	for _, s := range [][2]string{{"X-Order", "42"}, {"Nats-Rollup", "sub"}, {"nats-ttl", "1s"}, {"Keylane-Redrive-Of", "x"}, {"Status", "100"}, {"X:Y", "1"}, {"X", " 1"}, {"traceparent", "00-aa-bb-01"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		if ValidateUserHeader(name, value) != nil {
			return
		}
		low := strings.ToLower(name)
		if strings.HasPrefix(low, "nats-") || strings.HasPrefix(low, "keylane-") || low == "status" || low == "description" {
			t.Fatalf("accepted reserved header %q", name)
		}
		if got := roundTrip(t, map[string][]string{name: {value}})[name]; len(got) != 1 || got[0] != value {
			t.Fatalf("header %q: %q arrives as %q", name, value, got)
		}
	})
}

func FuzzValidateReply(f *testing.F) {
	for _, s := range []string{"_INBOX.a.-1", "_INBOX.", "_INBOX..a", "_INBOX.>", "$JS.API.x", "_INBOX.a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		if ValidateReply(reply, "_INBOX.") != nil {
			return
		}
		for _, tok := range strings.Split(reply, ".") {
			if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
				t.Fatalf("accepted reply %q with token %q", reply, tok)
			}
		}
	})
}

// ours are the Keylane-* headers DeadHeader writes itself.
var ours = map[string]bool{HeaderDelayedID: true, HeaderKey: true, HeaderType: true, HeaderError: true, HeaderAttempts: true, HeaderWorker: true,
	HeaderSeq: true, HeaderPartition: true, HeaderFence: true, HeaderPayloadDropped: true}

// FuzzParse reads a job message made of fuzzed fields and extra headers:
// a job it accepts has every field within its rule, and the dead letter
// of any message, accepted or not, holds no Nats-* header but the ID, no
// received Keylane-* header, and arrives as built.
func FuzzParse(f *testing.F) {
	key := keyIn(1, 4)
	f.Add("", key, "order.1", "", "paid", "_INBOX.a.-1", "4", "X-Order", "42")
	f.Add("", key+" ", "order 1", "", "", "", "", "Nats-Rollup", "sub")
	f.Add("", key, "", "hold.7", "", "", "4", "Nats-Scheduler", "ns.sched.1.hold~7")
	f.Add("", key, "", "hold.7", "", "", "4", "Nats-Stream-Source", "NS_DELAYS 3 ns.due.1.* x y z")
	f.Add("", key, "order..1", "", "", "$JS.API.STREAM.PURGE.x", "8", "Keylane-Redrive-Of", "victim")
	f.Add("ns.jobs.1.0000000000000000", "k", "a", "b", "\t", "_INBOX.>", "x", "Nats-Batch-Id", "b1")
	f.Fuzz(func(t *testing.T, subject, key, id, delayedID, typ, reply, n, extraName, extraValue string) {
		if subject == "" {
			subject = partition.Subject("ns", 1, key)
		}
		h := map[string][]string{}
		for k, v := range map[string]string{HeaderKey: key, HeaderJobID: id, HeaderDelayedID: delayedID, HeaderType: typ, HeaderReply: reply, HeaderPartitions: n} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		if extraName != "" {
			h[extraName] = append(h[extraName], extraValue)
		}
		j, err := rules4.Parse(subject, h)
		if err == nil {
			if ValidateKey(j.Key) != nil || partition.Subject("ns", 1, j.Key) != subject && !strings.HasSuffix(subject, "."+partition.KeyToken(j.Key)) || partition.Of(j.Key, 4) != 1 {
				t.Fatalf("accepted key %q on %q", j.Key, subject)
			}
			if j.ID != "" && ValidateJobID(j.ID) != nil || ValidateType(j.Type) != nil || j.Reply != "" && ValidateReply(j.Reply, "_INBOX.") != nil {
				t.Fatalf("accepted %+v", j)
			}
		}
		if j.Key != "" && (ValidateKey(j.Key) != nil || !strings.HasSuffix(subject, "."+partition.KeyToken(j.Key))) {
			t.Fatalf("kept key %q of %q", j.Key, subject)
		}
		d := DeadHeader(j, h, Dead{Error: "malformed: " + key + id, Worker: "w1", Seq: 1, Partition: 1, Fence: 2})
		for k, vs := range d {
			low := strings.ToLower(k)
			if strings.HasPrefix(low, "nats-") && k != HeaderJobID || low == "status" || low == "description" {
				t.Fatalf("dead letter carries %s: %q", k, vs)
			}
			if strings.HasPrefix(low, "keylane-") && !ours[k] {
				t.Fatalf("dead letter copies %s: %q", k, vs)
			}
		}
		if k, ok := d[HeaderKey]; ok && k[0] != j.Key || JobIDOfDead(d) != j.ID && ValidateJobID(j.ID) == nil {
			t.Fatalf("dead letter names %v / %v; Parse read %+v", d[HeaderKey], JobIDOfDead(d), j)
		}
		if got := roundTrip(t, d); !reflect.DeepEqual(got, d) {
			t.Fatalf("dead letter headers %q arrive as %q", d, got)
		}
	})
}
