package packstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/anchorstore"
	"cairn.dev/cairn/internal/store/cloudtest"
	"cairn.dev/cairn/internal/store/lagstore"
	"cairn.dev/cairn/internal/store/objstore"
	"cairn.dev/cairn/internal/store/packstore"
	"cairn.dev/cairn/internal/store/s3store"
	"cairn.dev/cairn/internal/store/storetest"
)

// TestMinIO runs packstore (and anchorstore over it) on a real S3 server:
// the conformance suite, the request counts of issue 5 (10,000 files of
// 4 KiB, at most one PUT per 100), ranged reads, a second device with an
// empty index, a repack, and the consistency anchor's error.
func TestMinIO(t *testing.T) {
	m := cloudtest.StartMinIO(t)
	var prefixes atomic.Int64
	s3 := func(t *testing.T, prefix string) *objstore.Store {
		t.Helper()
		s, err := s3store.New(bg, s3store.Options{
			Bucket: m.Bucket, Prefix: prefix, Endpoint: m.Endpoint, Insecure: true,
			Credentials: credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""),
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fresh := func() string { return fmt.Sprintf("p%d", prefixes.Add(1)) }

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) cairn.Store {
			return open(t, s3(t, fresh()), packstore.Options{Dir: t.TempDir()})
		})
	})

	t.Run("FewRequests", func(t *testing.T) {
		prefix := fresh()
		bucket := s3(t, prefix)
		// A longer linger than the default, as in TestFewPuts, so that
		// the count does not depend on scheduling under -race.
		s := open(t, bucket, packstore.Options{Linger: 100 * time.Millisecond})
		defer s.Close()
		ids, data := blobs(100000, 10000, 4096)
		before := bucket.Requests()
		start := time.Now()
		putAll(t, s, ids, data, 256)
		d := bucket.Requests().Sub(before)
		t.Logf("10,000 Puts of 4 KiB from 256 goroutines: %v in %v", d, time.Since(start))
		if d.Put > 100 || d.Total() != d.Put {
			t.Errorf("10,000 Puts sent %v, want at most 100 PUTs and nothing else", d)
		}
		before = bucket.Requests()
		for i := range 1000 {
			mustGet(t, s, ids[i], data[i])
		}
		// Read in the order written: read-ahead spans of 4 MiB.
		if d2 := bucket.Requests().Sub(before); d2.Get > 50 || d2.Total() != d2.Get {
			t.Errorf("1,000 Gets in order sent %v, want at most 50 ranged GETs", d2)
		}
		// Another device, with an empty index, learns every pack from
		// its trailer: one listing and one or two ranged GETs per pack.
		other := s3(t, prefix)
		o := open(t, other, packstore.Options{})
		defer o.Close()
		packs := s.Requests().Put
		d = other.Requests()
		t.Logf("a second device learned %d packs with %v", packs, d)
		if d.List != 1 || d.Get > 2*packs || d.Total() != d.List+d.Get {
			t.Errorf("opening over %d packs sent %v", packs, d)
		}
		found, err := o.Has(bg, ids)
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range found {
			if !f {
				t.Fatalf("second device: Has %s = false", ids[i].Short())
			}
		}
		for i := 9000; i < 10000; i++ {
			mustGet(t, o, ids[i], data[i])
		}
	})

	t.Run("Repack", func(t *testing.T) {
		prefix := fresh()
		s := open(t, s3(t, prefix), packOpts(t.TempDir()))
		defer s.Close()
		c := fillAndDelete(t, s)
		rep, err := s.Repack(bg, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		if rep.PacksRewritten == 0 || rep.BytesReclaimed <= 0 {
			t.Errorf("Repack = %+v", rep)
		}
		c.check(t, s, 50)
		o := open(t, s3(t, prefix), packOpts(t.TempDir()))
		defer o.Close()
		c.check(t, o, 50)
	})

	// The consistency anchor on a real server: a device reads what
	// another wrote since it last listed the bucket; an ID that no
	// device wrote fails after the bound with the anchor's error.
	t.Run("Anchor", func(t *testing.T) {
		prefix := fresh()
		writer := open(t, s3(t, prefix), packstore.Options{})
		defer writer.Close()
		reader := anchorstore.New(open(t, s3(t, prefix), packstore.Options{}),
			anchorstore.Options{Name: "s3://" + m.Bucket + "/" + prefix, Wait: 300 * time.Millisecond})
		defer reader.Close()
		id, data := storetest.Blob(7, 5000)
		if err := writer.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		mustGet(t, reader, id, data)
		never, _ := storetest.Blob(8, 5000)
		_, err := reader.Get(bg, never)
		if !errors.Is(err, cairn.ErrNotFound) || !strings.Contains(err.Error(), "still does not have this object") || !strings.Contains(err.Error(), prefix) {
			t.Fatalf("Get of an ID never written: err = %v, want the anchor's NotFound naming the store", err)
		}
	})

	// The same over the real server made to lag like an eventually
	// consistent one: new objects (packs) stay invisible for 300 ms.
	t.Run("AnchorLagging", func(t *testing.T) {
		const lag = 300 * time.Millisecond
		lagging := lagstore.New(s3(t, fresh()), lagstore.Options{Delay: lag})
		writer := open(t, lagging, packstore.Options{})
		p := open(t, lagging, packstore.Options{})
		reader := anchorstore.New(p, anchorstore.Options{Name: "lagging MinIO"})
		id, data := storetest.Blob(9, 5000)
		start := time.Now()
		if err := writer.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		mustGet(t, reader, id, data)
		if took := time.Since(start); took < lag || lagging.Hidden() == 0 || p.Requests().List < 3 {
			t.Fatalf("read after %v, %d refusals, %+v: the lag was not exercised", took, lagging.Hidden(), p.Requests())
		}
		if err := reader.Close(); err != nil {
			t.Fatal(err)
		}
		if err := writer.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
