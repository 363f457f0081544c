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
