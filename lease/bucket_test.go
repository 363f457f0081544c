package lease_test

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// An operator deletes the leases bucket and EnsureBucket makes it again:
// the new bucket's fences must still be above every fence of the old one,
// which stores next to per-key state may still hold.
func TestFenceGrowsAcrossRecreatedBucket(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	ctx := t.Context()

	old := acquire(t, e.kv, "p.0", config(t, "old"))
	for i := range 3 { // more tenures, so the old bucket's sequence moves on
		if err := old.Release(ctx); err != nil {
			t.Fatal(err)
		}
		old = acquire(t, e.kv, "p.0", config(t, "old"))
		t.Logf("old bucket, tenure %d: fence %d", i+2, old.Fence())
	}
	old.Orphan()

	if err := e.js.DeleteKeyValue(ctx, bucketName); err != nil {
		t.Fatal(err)
	}
	// Right after a delete, the server may still be removing the old
	// store and refuse the create ("error creating store for stream", seen
	// on a loaded machine); keylane's Setup retries that, so do we.
	var kv jetstream.KeyValue
	var err error
	testwait.Eventually(t, 10*time.Second, "the bucket created again", func() bool {
		kv, err = lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: bucketName, TTL: ttl})
		return err == nil
	})
	for _, key := range []string{"p.0", "p.1"} {
		l := acquire(t, kv, key, config(t, "new"))
		if l.Fence() <= old.Fence() {
			t.Fatalf("fence of %q in the re-created bucket is %d, not above %d from the old bucket", key, l.Fence(), old.Fence())
		}
		t.Logf("re-created bucket: fence of %q is %d (old bucket's last: %d)", key, l.Fence(), old.Fence())
	}
}

// EnsureBucket makes its bucket's stream itself (to set FirstSeq); apart
// from the name and FirstSeq it must be the stream nats.go's
// CreateKeyValue makes, and a bucket made by CreateKeyValue (as before
// FirstSeq was set) must still open.
func TestEnsureBucketMakesTheStreamNatsKVWould(t *testing.T) {
	e := newEnv(t, 2*time.Second)
	ctx := t.Context()
	for _, ttl := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Minute} {
		t.Run(ttl.String(), func(t *testing.T) {
			ours, err := lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: "OURS", TTL: ttl, Replicas: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = e.js.DeleteKeyValue(ctx, "OURS") }()
			theirs, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: "THEIRS", TTL: ttl, History: 1, Storage: jetstream.FileStorage, Replicas: 1,
				LimitMarkerTTL: max(ttl.Truncate(time.Second), time.Second),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = e.js.DeleteKeyValue(ctx, "THEIRS") }()

			a, b := streamConfig(t, ours), streamConfig(t, theirs)
			if a.FirstSeq < uint64(time.Now().Add(-time.Minute).UnixMicro()) {
				t.Fatalf("FirstSeq %d is not the creation time in microseconds", a.FirstSeq)
			}
			a.Name, a.Subjects, a.FirstSeq = b.Name, b.Subjects, b.FirstSeq
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("stream of EnsureBucket:\n%+v\nstream of CreateKeyValue:\n%+v", a, b)
			}

			// A bucket that nats.go made opens, and leases work on it.
			kv, err := lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: "THEIRS", TTL: ttl})
			if err != nil {
				t.Fatalf("EnsureBucket on a bucket made by CreateKeyValue: %v", err)
			}
			if ttl < time.Minute {
				l := acquire(t, kv, "p.0", config(t, "holder"))
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func streamConfig(t *testing.T, kv jetstream.KeyValue) jetstream.StreamConfig {
	t.Helper()
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
}

// Workers that start together all call EnsureBucket at once: each asks for
// a different FirstSeq, one creates the bucket, and all open that one.
func TestEnsureBucketByConcurrentCreators(t *testing.T) {
	s := natstest.Start(t)
	const creators = 8
	var (
		wg        sync.WaitGroup
		firstSeqs [creators]uint64
		errs      [creators]error
	)
	for i := range creators {
		js, err := jetstream.New(natstest.Connect(t, s))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			kv, err := lease.EnsureBucket(t.Context(), js, lease.BucketConfig{Name: bucketName, TTL: time.Second})
			if err != nil {
				errs[i] = err
				return
			}
			st, err := kv.Status(t.Context())
			if err != nil {
				errs[i] = err
				return
			}
			firstSeqs[i] = st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.FirstSeq
		})
	}
	wg.Wait()
	for i := range creators {
		if errs[i] != nil {
			t.Fatalf("creator %d: %v", i, errs[i])
		}
		if firstSeqs[i] != firstSeqs[0] {
			t.Fatalf("creators see different buckets: FirstSeq %d and %d", firstSeqs[0], firstSeqs[i])
		}
	}
	t.Logf("%d creators, one bucket with FirstSeq %d", creators, firstSeqs[0])
}
