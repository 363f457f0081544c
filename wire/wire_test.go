package wire

import (
	"errors"
	"strings"
	"testing"

	"github.com/keylane/keylane/partition"
)

func TestValidateJobID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"order-1", true},
		{"order.1", true},
		{"a.b.c", true},
		{"A_b=c-9", true},
		{strings.Repeat("x", MaxJobIDLen), true},
		{"", false},
		{strings.Repeat("x", MaxJobIDLen+1), false},
		{"order..1", false}, // the results bucket cannot hold it
		{".order", false},
		{"order.", false},
		{"order 1", false},
		{"order*", false},
		{"order>", false},
		{"ordér", false},
		{"a/b", false},
	} {
		err := ValidateJobID(tc.id)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrBadJobID) {
			t.Errorf("ValidateJobID(%q) = %v; want ok=%v", tc.id, err, tc.ok)
		}
	}
}

// ValidateJob checks a client's job field by field in its documented
// order and returns the first refusal: a job bad in two fields is
// refused for the earlier one; an empty reply or ID is not checked.
func TestValidateJob(t *testing.T) {
	good := BatchJob{Key: "sku:7", ID: "order-1", Type: "buy", Reply: "_INBOX.c.1", Header: map[string][]string{"X-Shop": {"a"}}}
	for name, tc := range map[string]struct {
		edit func(*BatchJob)
		want error
	}{
		"good":                 {func(*BatchJob) {}, nil},
		"no reply, no ID":      {func(j *BatchJob) { j.Reply, j.ID = "", "" }, nil},
		"bad key before type":  {func(j *BatchJob) { j.Key, j.Type = "", " buy" }, partition.ErrEmptyKey},
		"bad type before head": {func(j *BatchJob) { j.Type, j.Header = " buy", map[string][]string{"Nats-X": {"1"}} }, ErrBadType},
		"bad head before reply": {func(j *BatchJob) {
			j.Header, j.Reply = map[string][]string{"Nats-X": {"1"}}, "elsewhere.1"
		}, ErrReservedHeader},
		"bad reply before ID": {func(j *BatchJob) { j.Reply, j.ID = "elsewhere.1", "a..b" }, ErrBadReply},
		"bad ID":              {func(j *BatchJob) { j.ID = "a..b" }, ErrBadJobID},
	} {
		j := good
		tc.edit(&j)
		err := ValidateJob(j, "_INBOX.")
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: ValidateJob = %v, want %v", name, err, tc.want)
		}
	}
}

func TestValidateKeyIsPartitions(t *testing.T) {
	for _, k := range []string{"sku:7", "sku:7 ", " sku:7", "sku\t7", "sku:7\t", "", "a\r\nb", "siège A7"} {
		if got, want := ValidateKey(k), partition.ValidateKey(k); (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
			t.Errorf("ValidateKey(%q) = %v; partition's %v", k, got, want)
		}
	}
	for _, k := range []string{"sku:7 ", " sku:7", "sku\t7", "sku:7\n"} {
		if ValidateKey(k) == nil {
			t.Errorf("ValidateKey(%q) accepted", k)
		}
	}
}

func TestValidateType(t *testing.T) {
	for _, tc := range []struct {
		typ string
		ok  bool
	}{
		{"", true},
		{"order.paid", true},
		{"réservation payée", true},
		{strings.Repeat("t", MaxTypeLen), true},
		{strings.Repeat("t", MaxTypeLen+1), false},
		{" paid", false},
		{"paid ", false},
		{"pa\tid", false},
		{"pa\r\nid", false},
		{"\xff", false},
	} {
		if err := ValidateType(tc.typ); (err == nil) != tc.ok {
			t.Errorf("ValidateType(%q) = %v; want ok=%v", tc.typ, err, tc.ok)
		}
	}
}

func TestValidateReply(t *testing.T) {
	const prefix = "_INBOX."
	for _, tc := range []struct {
		reply string
		ok    bool
	}{
		{"_INBOX.abc.-1x", true},
		{"_INBOX.a", true},
		{"_INBOX.", false},
		{"_INBOX", false},
		{"$JS.API.STREAM.PURGE.keylane_jobs", false},
		{"_INBOX..a", false},
		{"_INBOX.a.", false},
		{"_INBOX.*", false},
		{"_INBOX.a.>", false},
		{"_INBOX.a b", false},
		{"_INBOX.a\tb", false},
		{"_INBOX.a\x00", false},
		{"keylane.jobs.0.x", false},
	} {
		if err := ValidateReply(tc.reply, prefix); (err == nil) != tc.ok {
			t.Errorf("ValidateReply(%q) = %v; want ok=%v", tc.reply, err, tc.ok)
		}
	}
	if ValidateReply("_INBOX.a", "") == nil {
		t.Error("a reply was accepted under an empty prefix")
	}
}

func TestValidateUserHeader(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        error
	}{
		{"X-Order", "42", nil},
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", nil},
		{"tracestate", "a=b", nil},
		{"X-Empty", "", nil},
		{"X-Inner", "a b\tc", nil},
		{"Nats-Rollup", "sub", ErrReservedHeader},
		{"nats-rollup", "sub", ErrReservedHeader},
		{"NATS-TTL", "1s", ErrReservedHeader},
		{"Nats-Msg-Id", "x", ErrReservedHeader},
		{"Keylane-Redrive-Of", "x", ErrReservedHeader},
		{"keylane-key", "x", ErrReservedHeader},
		{"Status", "100", ErrReservedHeader},
		{"description", "x", ErrReservedHeader},
		{"", "x", ErrBadHeader},
		{"X Order", "x", ErrBadHeader},
		{"X:Order", "x", ErrBadHeader},
		{"X/Order", "x", ErrBadHeader},
		{"Xé", "x", ErrBadHeader},
		{"X-Order", " 42", ErrBadHeader},
		{"X-Order", "42\t", ErrBadHeader},
		{"X-Order", "4\r\n2", ErrBadHeader},
	} {
		if err := ValidateUserHeader(tc.name, tc.value); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("ValidateUserHeader(%q, %q) = %v; want %v", tc.name, tc.value, err, tc.want)
		}
	}
}

// rules4 is partition 1 of namespace "ns" with 4 partitions.
var rules4 = Rules{Namespace: "ns", Partition: 1, Partitions: 4, ReplyPrefix: "_INBOX."}

// keyIn returns a key of partition p of n.
func keyIn(p, n int) string {
	for i := 0; ; i++ {
		k := "sku:" + strings.Repeat("7", i%5) + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if partition.Of(k, n) == p && partition.ValidateKey(k) == nil {
			return k
		}
	}
}

func TestParse(t *testing.T) {
	key := keyIn(1, 4)
	other := keyIn(2, 4)
	subj := partition.Subject("ns", 1, key)
	good := func() map[string][]string {
		return map[string][]string{
			HeaderJobID: {"order.1"}, HeaderKey: {key}, HeaderPartitions: {"4"}, HeaderType: {"paid"},
			HeaderReply: {"_INBOX.x.-1"}, HeaderKeepOutcome: {"1"}, "Nats-Expected-Stream": {"NS_JOBS"},
		}
	}
	j, err := rules4.Parse(subj, good())
	if err != nil || j != (Job{ID: "order.1", Key: key, Type: "paid", Reply: "_INBOX.x.-1", KeepOutcome: true}) {
		t.Fatalf("Parse(good) = %+v, %v", j, err)
	}
	delayed := good()
	delete(delayed, HeaderJobID)
	delayed[HeaderDelayedID] = []string{"hold.7"}
	delayed["Nats-Scheduler"] = []string{"ns.sched.1.hold~7"}
	delayed["Nats-Stream-Source"] = []string{"NS_DELAYS 42 ns.due.1.* ns.jobs.1.{{wildcard(1)}} ns.due.1.x abc"}
	withDelays := rules4
	withDelays.Delays, withDelays.DelaysStream = true, "NS_DELAYS"
	if j, err := withDelays.Parse(subj, delayed); err != nil || j.ID != "hold.7" || j.DueSeq != 42 {
		t.Fatalf("Parse(delayed) = %+v, %v", j, err)
	}
	// Not sourced from the delays stream: the server refuses
	// Nats-Stream-Source from publishers, so only a due copy has it.
	for _, src := range [][]string{nil, {"NS_OTHER 42 x"}, {"NS_DELAYS"}, {"NS_DELAYS x"}} {
		h := good()
		delete(h, HeaderJobID)
		h[HeaderDelayedID] = []string{"hold.7"}
		h["Nats-Scheduler"] = []string{"ns.sched.1.hold~7"}
		if src != nil {
			h["Nats-Stream-Source"] = src
		}
		if j, err := withDelays.Parse(subj, h); err == nil || !strings.Contains(err.Error(), "not sourced from the delays stream") || j.ID != "" {
			t.Fatalf("Parse(delayed, source %q) = %+v, %v; want a refusal", src, j, err)
		}
	}
	// The submission's subject was the delay subject, never the due copy's.
	delayed["Nats-Scheduler"] = []string{"ns.delay.1.hold~7"}
	if j, err := withDelays.Parse(subj, delayed); err == nil || j.ID != "" {
		t.Fatalf("Parse(delayed, the submission's subject as scheduler) = %+v, %v; want a refusal", j, err)
	}
	delayed["Nats-Scheduler"] = []string{"ns.sched.1.hold~7"}
	runAt := good()
	runAt[HeaderRunAt] = []string{"2026-11-26T12:00:00Z"}
	if _, err := rules4.Parse(subj, runAt); err == nil || !strings.Contains(err.Error(), HeaderRunAt) {
		t.Fatalf("Parse(Keylane-Run-At on a key's subject) = %v; want a refusal", err)
	}
	// Keylane-Job-Id from anyone but that job's schedule is a forged ID.
	if j, err := rules4.Parse(subj, delayed); err == nil || !strings.Contains(err.Error(), "without delays") || j.ID != "" {
		t.Fatalf("Parse(delayed, no delays) = %+v, %v; want a refusal", j, err)
	}
	delayed["Nats-Scheduler"] = []string{"ns.sched.1.victim~1"}
	if j, err := withDelays.Parse(subj, delayed); err == nil || !strings.Contains(err.Error(), "not made by that job's schedule") || j.ID != "" {
		t.Fatalf("Parse(delayed, another schedule) = %+v, %v; want a refusal", j, err)
	}
	delete(delayed, "Nats-Scheduler")
	if j, err := withDelays.Parse(subj, delayed); err == nil || j.ID != "" {
		t.Fatalf("Parse(Keylane-Job-Id without a schedule) = %+v, %v; want a refusal", j, err)
	}
	none := good()
	delete(none, HeaderJobID)
	if j, err := rules4.Parse(subj, none); err != nil || j.ID != "" {
		t.Fatalf("Parse(no ID) = %+v, %v", j, err)
	}

	for _, tc := range []struct {
		name    string
		subject string
		mod     func(h map[string][]string)
		reason  string
		keep    Job // what must still be read
	}{
		{"bad ID", subj, func(h map[string][]string) { h[HeaderJobID] = []string{"order 1"} }, "bad Nats-Msg-Id header", Job{Key: key, Reply: "_INBOX.x.-1"}},
		{"ID with ..", subj, func(h map[string][]string) { h[HeaderJobID] = []string{"order..1"} }, "bad Nats-Msg-Id header", Job{Key: key}},
		{"bad delayed ID", subj, func(h map[string][]string) { delete(h, HeaderJobID); h[HeaderDelayedID] = []string{"a..b"} }, "bad Keylane-Job-Id header", Job{Key: key}},
		{"no key", subj, func(h map[string][]string) { delete(h, HeaderKey) }, "bad Keylane-Key header", Job{ID: "order.1"}},
		{"key with a tab", subj, func(h map[string][]string) { h[HeaderKey] = []string{key + "\t"} }, "control character", Job{ID: "order.1"}},
		{"trimmed key", partition.Subject("ns", 1, key+" "), nil, "is not key", Job{ID: "order.1"}},
		{"other partition", partition.Subject("ns", 1, other), func(h map[string][]string) { h[HeaderKey] = []string{other} }, "belongs to partition 2", Job{ID: "order.1"}},
		{"two keys", subj, func(h map[string][]string) { h[HeaderKey] = []string{key, other} }, "given 2 times", Job{ID: "order.1"}},
		{"other N", subj, func(h map[string][]string) { h[HeaderPartitions] = []string{"8"} }, "counts 8 partitions", Job{Key: key, ID: "order.1"}},
		{"reply into the API", subj, func(h map[string][]string) { h[HeaderReply] = []string{"$JS.API.STREAM.DELETE.x"} }, "bad Keylane-Reply header", Job{Key: key, ID: "order.1"}},
		{"bad type", subj, func(h map[string][]string) { h[HeaderType] = []string{" paid"} }, "bad Keylane-Type header", Job{Key: key, ID: "order.1"}},
		{"rollup", subj, func(h map[string][]string) { h["Nats-Rollup"] = []string{"sub"} }, "Nats-Rollup", Job{Key: key, ID: "order.1"}},
		{"schedule", subj, func(h map[string][]string) { h["Nats-Schedule"] = []string{"@at 2030-01-01T00:00:00Z"} }, "Nats-Schedule", Job{Key: key, ID: "order.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := good()
			if tc.mod != nil {
				tc.mod(h)
			}
			j, err := rules4.Parse(tc.subject, h)
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Parse = %+v, %v; want a refusal saying %q", j, err, tc.reason)
			}
			if tc.keep.Key != "" && j.Key != tc.keep.Key || tc.keep.ID != "" && j.ID != tc.keep.ID || tc.keep.Reply != "" && j.Reply != tc.keep.Reply {
				t.Fatalf("Parse kept %+v; want at least %+v", j, tc.keep)
			}
			if strings.Contains(tc.name, "key") && j.Key != "" {
				t.Fatalf("a refused key was kept: %q", j.Key)
			}
		})
	}
}

func TestDeadHeaderCopiesNoControlHeader(t *testing.T) {
	received := map[string][]string{
		HeaderJobID: {"order.1"}, HeaderKey: {"sku:7"}, HeaderReply: {"_INBOX.a"},
		"Nats-Scheduler": {"ns.delay.0.x"}, "Nats-Schedule-Next": {"purge"},
		"Nats-Batch-Id": {"b1"}, "Nats-Batch-Sequence": {"1"}, "Nats-Batch-Commit": {"1"},
		"Nats-Rollup": {"sub"}, "Nats-Expected-Stream": {"NS_JOBS"}, "nats-ttl": {"1s"},
		"Keylane-Redrive-Of": {"victim"}, "Keylane-Error": {"forged"}, "Status": {"100"},
		"X-Order": {"42"}, "traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"X Bad": {"1"}, "X-Trimmed": {" 1"},
	}
	h := DeadHeader(Job{ID: "order.1", Key: "sku:7", Type: "paid"}, received, Dead{ID: DeadID(0xab, 9), Error: "boom\r\nline two", Attempts: 3, Worker: "w1", Seq: 9, Partition: 2, Fence: 5})
	for k := range h {
		if hasPrefixFold(k, "Nats-") && k != HeaderJobID || k == "Status" || k == "X Bad" || k == "X-Trimmed" || k == "Keylane-Redrive-Of" || k == HeaderReply {
			t.Errorf("dead letter carries %s: %v", k, h[k])
		}
	}
	// The dead letter's own ID de-duplicates it; the job's is in
	// Keylane-Job-Id (TestDeadLetterOfAForgedIDTakesNoOthersPlace).
	want := map[string]string{HeaderJobID: "dl-ab-9", HeaderDelayedID: "order.1", HeaderKey: "sku:7", HeaderType: "paid", HeaderError: "boom  line two", HeaderAttempts: "3",
		HeaderWorker: "w1", HeaderSeq: "9", HeaderPartition: "2", HeaderFence: "5", "X-Order": "42"}
	for k, v := range want {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q; want %q", k, got, v)
		}
	}
	if got := JobIDOfDead(h); got != "order.1" {
		t.Errorf("JobIDOfDead = %q", got)
	}
	if got := JobIDOfDead(map[string][]string{HeaderJobID: {"order.1"}}); got != "order.1" {
		t.Errorf("JobIDOfDead of an earlier release's dead letter = %q", got)
	}
	if h := DeadHeader(Job{ID: "order..1", Key: "sku:7 "}, nil, Dead{}); h[HeaderJobID] != nil || h[HeaderDelayedID] != nil || h[HeaderKey] != nil || h[HeaderError][0] != "(no error text)" {
		t.Errorf("DeadHeader took an invalid ID or key: %v", h)
	}
	if got := DeadErrorText(strings.Repeat("é", DeadErrorMax)); len(got) > DeadErrorMax+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("DeadErrorText cut to %d bytes", len(got))
	}
}

// TestCheapOnTheHotPath: a valid job is built and read without an
// allocation for the checks (ValidateReply runs on every Call).
func TestCheapOnTheHotPath(t *testing.T) {
	key := keyIn(1, 4)
	subj := partition.Subject("ns", 1, key)
	h := map[string][]string{HeaderJobID: {"order.1"}, HeaderKey: {key}, HeaderPartitions: {"4"}, HeaderReply: {"_INBOX.x.-1"}}
	if n := testing.AllocsPerRun(100, func() {
		_ = ValidateReply("_INBOX.abc.-1x", "_INBOX.")
		_ = ValidateJobID("order.1")
		_ = ValidateKey(key)
		_ = ValidateType("paid")
		_ = ValidateUserHeaders(nil)
	}); n != 0 {
		t.Errorf("the client's checks allocate %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = rules4.Parse(subj, h) }); n > 1 {
		t.Errorf("Parse allocates %v times; want at most the key token", n)
	}
}
