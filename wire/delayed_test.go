package wire

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/partition"
)

var delays4 = Rules{Namespace: "ns", Partition: 1, Partitions: 4, ReplyPrefix: "_INBOX.", Delays: true, DelaysStream: "NS_DELAYS"}

func submission(key, id, runAt string) (string, map[string][]string) {
	h := map[string][]string{HeaderKey: {key}, HeaderJobID: {id}, HeaderPartitions: {"4"}, HeaderType: {"hold"},
		HeaderRunAt: {runAt}, HeaderIdempotent: {"1"}, "X-Seat": {"A7"}}
	return partition.DelaySubject("ns", 1, id), h
}

// TestParseDelayed: a delayed job's submission is read with the job's
// rules, its subject the ID's, its ID required in Nats-Msg-Id, its run-at
// required and bounded; each refusal names its reason and keeps what may
// still be trusted.
func TestParseDelayed(t *testing.T) {
	key := keyIn(1, 4)
	stored := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	at := stored.Add(time.Hour).Format(time.RFC3339Nano)
	subj, h := submission(key, "hold.7", at)
	d, err := delays4.ParseDelayed(subj, h, stored)
	if err != nil || d.ID != "hold.7" || d.Key != key || d.Type != "hold" || !d.RunAt.Equal(stored.Add(time.Hour)) {
		t.Fatalf("ParseDelayed(good) = %+v, %v", d, err)
	}
	// Due already (a worker down a while): still a valid submission.
	subj, h = submission(key, "hold.7", stored.Add(-time.Hour).Format(time.RFC3339Nano))
	if _, err := delays4.ParseDelayed(subj, h, stored); err != nil {
		t.Fatalf("ParseDelayed(past) = %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(subject *string, h map[string][]string)
		want string
	}{
		{"no run-at", func(_ *string, h map[string][]string) { delete(h, HeaderRunAt) }, "carries no Keylane-Run-At"},
		{"bad run-at", func(_ *string, h map[string][]string) { h[HeaderRunAt] = []string{"tomorrow"} }, "bad Keylane-Run-At"},
		{"two run-ats", func(_ *string, h map[string][]string) { h[HeaderRunAt] = []string{at, at} }, "given 2 times"},
		{"too far", func(_ *string, h map[string][]string) {
			h[HeaderRunAt] = []string{stored.Add(MaxDelay + RunAtSlack + time.Second).Format(time.RFC3339Nano)}
		}, "more than"},
		{"no ID", func(_ *string, h map[string][]string) { delete(h, HeaderJobID) }, "carries no Nats-Msg-Id"},
		{"bad ID", func(_ *string, h map[string][]string) { h[HeaderJobID] = []string{"a..b"} }, "bad Nats-Msg-Id"},
		{"Keylane-Job-Id", func(_ *string, h map[string][]string) { h[HeaderDelayedID] = []string{"victim"} }, "carries Keylane-Job-Id"},
		{"another ID's subject", func(s *string, _ map[string][]string) { *s = partition.DelaySubject("ns", 1, "victim") }, "is not delayed job"},
		{"a reply", func(_ *string, h map[string][]string) { h[HeaderReply] = []string{"_INBOX.x"} }, "carries Keylane-Reply"},
		{"another partition's key", func(_ *string, h map[string][]string) { h[HeaderKey] = []string{keyIn(2, 4)} }, "belongs to partition 2"},
		{"a roll-up", func(_ *string, h map[string][]string) { h["Nats-Rollup"] = []string{"sub"} }, "Nats-Rollup"},
	} {
		subj, h := submission(key, "hold.7", at)
		tc.mod(&subj, h)
		d, err := delays4.ParseDelayed(subj, h, stored)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !d.RunAt.IsZero() {
			t.Errorf("%s: %+v, %v; want a refusal naming %q", tc.name, d, err, tc.want)
		}
	}
	subj, h = submission(key, "hold.7", at)
	noDelays := delays4
	noDelays.Delays = false
	if _, err := noDelays.ParseDelayed(subj, h, stored); err == nil {
		t.Error("a submission on a namespace without delays accepted")
	}
}

// TestSchedule: the schedule carries the job's accepted fields and the
// submitter's allowed headers, never its Nats-* or Keylane-* headers, and
// targets the key's due subject.
func TestSchedule(t *testing.T) {
	key := keyIn(1, 4)
	stored := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	subj, h := submission(key, "hold.7", stored.Add(time.Hour).Format(time.RFC3339Nano))
	h["Keylane-Redrive-Of"] = []string{"victim"}
	h["Nats-Expected-Stream"] = []string{"NS_JOBS"}
	d, err := delays4.ParseDelayed(subj, h, stored)
	if err != nil {
		t.Fatal(err)
	}
	to, sh := delays4.Schedule(d, h, MoveID(0xab, 9))
	want := map[string][]string{
		HeaderKey: {key}, HeaderType: {"hold"}, HeaderDelayedID: {"hold.7"}, HeaderIdempotent: {"1"}, HeaderPartitions: {"4"},
		"Nats-Schedule": {"@at 2026-11-26T13:00:00Z"}, "Nats-Schedule-Target": {partition.DueSubject("ns", 1, key)},
		HeaderJobID: {"mv-ab-9"}, "X-Seat": {"A7"},
	}
	if to != "ns.sched.1.hold~7" || !reflect.DeepEqual(sh, want) {
		t.Fatalf("Schedule = %s %v\nwant ns.sched.1.hold~7 %v", to, sh, want)
	}
}

// FuzzParseDelayed: a submission ParseDelayed accepts has every field
// within its rule and a run-at within MaxDelay of its storing; its
// schedule carries no received Nats-*/Keylane-* header and arrives as
// built.
func FuzzParseDelayed(f *testing.F) {
	key := keyIn(1, 4)
	f.Add("", key, "hold.7", "2026-11-26T13:00:00Z", "hold", "X-Seat", "A7")
	f.Add("ns.delay.1.victim", key, "hold.7", "2026-11-26T13:00:00Z", "", "Nats-Rollup", "sub")
	f.Add("", key, "a..b", "2099-01-01T00:00:00Z", "", "Keylane-Job-Id", "victim")
	f.Add("", key+" ", "hold.7", "now", "\t", "Keylane-Reply", "_INBOX.x")
	stored := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, subject, key, id, runAt, typ, extraName, extraValue string) {
		if subject == "" {
			subject = partition.DelaySubject("ns", 1, id)
		}
		h := map[string][]string{}
		for k, v := range map[string]string{HeaderKey: key, HeaderJobID: id, HeaderType: typ, HeaderRunAt: runAt} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		if extraName != "" {
			h[extraName] = append(h[extraName], extraValue)
		}
		d, err := delays4.ParseDelayed(subject, h, stored)
		if err != nil {
			return
		}
		if ValidateKey(d.Key) != nil || partition.Of(d.Key, 4) != 1 || ValidateJobID(d.ID) != nil || ValidateType(d.Type) != nil ||
			subject != partition.DelaySubject("ns", 1, d.ID) || d.RunAt.After(stored.Add(MaxDelay+RunAtSlack)) || d.Reply != "" {
			t.Fatalf("accepted %+v on %q", d, subject)
		}
		_, sh := delays4.Schedule(d, h, MoveID(1, 2))
		for k, vs := range sh {
			low := strings.ToLower(k)
			if strings.HasPrefix(low, "keylane-") && k != HeaderKey && k != HeaderType && k != HeaderDelayedID && k != HeaderIdempotent && k != HeaderPartitions {
				t.Fatalf("schedule copies %s: %q", k, vs)
			}
			if strings.HasPrefix(low, "nats-") && k != HeaderJobID && k != "Nats-Schedule" && k != "Nats-Schedule-Target" || low == "status" || low == "description" {
				t.Fatalf("schedule carries %s: %q", k, vs)
			}
		}
		if got := roundTrip(t, sh); !reflect.DeepEqual(got, sh) {
			t.Fatalf("schedule headers %q arrive as %q", sh, got)
		}
	})
}

// TestParseDelayedBatch: a delayed submission in the one format is a batch
// of one on its ID's delay subject with Keylane-Run-At on the message;
// each way it breaks that is refused with the reason, and what passes
// gives the job, its own headers and its payload for the schedule.
func TestParseDelayedBatch(t *testing.T) {
	r := rules4
	r.Delays = true
	k := keyIn(1, 4)
	stored := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := stored.Add(time.Hour).Format(time.RFC3339Nano)
	one := encode(t, []BatchJob{{Key: k, ID: "release.1", Idempotent: true, Type: "release", Header: map[string][]string{"X-Order": {"7"}}, Payload: []byte("p")}})
	generated := encode(t, []BatchJob{{Key: k, ID: tbID(0), Payload: []byte("p")}})
	h := func(n int, runAt ...string) map[string][]string {
		h := batchHeaderOf(n)
		if runAt != nil {
			h[HeaderRunAt] = runAt
		}
		return h
	}
	subj := partition.DelaySubject("ns", 1, "release.1")
	d, hdrs, payload, err := r.ParseDelayedBatch(subj, h(1, at), one, stored)
	if err != nil || d.ID != "release.1" || d.Key != k || d.Type != "release" || !d.RunAt.Equal(stored.Add(time.Hour)) || hdrs["X-Order"][0] != "7" || string(payload) != "p" {
		t.Fatalf("a valid submission: %+v, %v, %q, %v", d, hdrs, payload, err)
	}
	if d, _, _, err := r.ParseDelayedBatch(partition.DelaySubject("ns", 1, tbID(0)), h(1, at), generated, stored); err != nil || d.ID != tbID(0) {
		t.Fatalf("a submission with a generated ID: %+v, %v", d, err)
	}
	two := encode(t, []BatchJob{{Key: k, ID: tbID(0)}, {Key: k, ID: tbID(1)}})
	withReply := encode(t, []BatchJob{{Key: k, ID: "release.1", Idempotent: true, Reply: "_INBOX.a.-1"}})
	redrive := h(1, at)
	redrive[HeaderRedriveOf] = []string{"order-1"}
	noDelays := rules4
	for _, c := range []struct {
		name    string
		r       Rules
		subject string
		h       map[string][]string
		body    []byte
		text    string
	}{
		{"on a namespace without delays", noDelays, subj, h(1, at), one, "without delays"},
		{"no run-at", r, subj, h(1), one, "carries no Keylane-Run-At"},
		{"run-at twice", r, subj, h(1, at, at), one, "given 2 times"},
		{"run-at not a time", r, subj, h(1, "tomorrow"), one, "want an RFC 3339 time"},
		{"run-at beyond the limit", r, subj, h(1, stored.Add(MaxDelay+2*RunAtSlack).Format(time.RFC3339Nano)), one, "more than"},
		{"two jobs", r, subj, h(2, at), two, "of 2 jobs"},
		{"a reply", r, subj, h(1, at), withReply, "carries a reply"},
		{"another ID's subject", r, partition.DelaySubject("ns", 1, "other"), h(1, at), one, "is not delayed job"},
		{"a redrive hint", r, subj, redrive, one, "a redrive is never delayed"},
		{"a broken body", r, subj, h(1, at), []byte("KLB\x01\x05"), "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, _, _, err := c.r.ParseDelayedBatch(c.subject, c.h, c.body, stored); err == nil || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("ParseDelayedBatch = %v; want a refusal with %q", err, c.text)
			}
		})
	}
	// And a batch on the batch subject may not carry a run-at.
	if _, err := rules4.ParseBatch(BatchSubject("ns", 1), h(1, at), generated); err == nil || !strings.Contains(err.Error(), "Keylane-Run-At") {
		t.Fatalf("a run-at on a batch on the batch subject: %v", err)
	}
}

// FuzzParseDelayedBatch: whatever the body and run-at, a submission is
// refused or gives a job on this partition whose subject is its ID's and
// whose run-at is within the limit; it never panics.
func FuzzParseDelayedBatch(f *testing.F) {
	r := rules4
	r.Delays = true
	k := keyIn(1, 4)
	stored := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	good, _ := EncodeBatch([]BatchJob{{Key: k, ID: "release.1", Idempotent: true, Payload: []byte("p")}})
	f.Add(good, "release.1", stored.Add(time.Hour).Format(time.RFC3339Nano))
	f.Add([]byte("KLB\x01"), "x", "2026-11-29T12:00:00Z")
	f.Fuzz(func(t *testing.T, body []byte, id, runAt string) {
		h := batchHeaderOf(1)
		h[HeaderRunAt] = []string{runAt}
		subject := "ns.delay.1." + id
		d, _, _, err := r.ParseDelayedBatch(subject, h, body, stored)
		if err != nil {
			return
		}
		if subject != partition.DelaySubject("ns", 1, d.ID) || partition.Of(d.Key, 4) != 1 || d.RunAt.After(stored.Add(MaxDelay+RunAtSlack)) || d.Reply != "" {
			t.Fatalf("accepted %+v on %s", d, subject)
		}
	})
}
