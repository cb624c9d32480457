package meta_test

import (
	"context"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

func TestStoreRegistry(t *testing.T) {
	ctx := context.Background()
	s, _ := newVol(t, 1)
	for _, bad := range []string{"", "local", "-x", "Upper", "a/b", "x y"} {
		if err := s.AddStore(ctx, meta.StoreRecord{Name: bad, URL: "file:///tmp"}); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("AddStore(%q) = %v, want Invalid", bad, err)
		}
	}
	if err := s.AddStore(ctx, meta.StoreRecord{Name: "s3a", URL: "s3://b/p"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddStore(ctx, meta.StoreRecord{Name: "s3a", URL: "s3://other"}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("duplicate = %v, want Exist", err)
	}
	if err := s.AddStore(ctx, meta.StoreRecord{Name: "gcs", URL: "gs://b"}); err != nil {
		t.Fatal(err)
	}
	list, err := s.Stores(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "gcs" || list[1].URL != "s3://b/p" {
		t.Fatalf("stores = %+v, %v", list, err)
	}
	if serr := s.SetStoreDraining(ctx, "s3a", true); serr != nil {
		t.Fatal(serr)
	}
	if rec, serr := s.Store(ctx, "s3a"); serr != nil || !rec.Draining {
		t.Fatalf("after drain = %+v, %v", rec, serr)
	}
	if serr := s.SetStoreDraining(ctx, "nope", true); !errors.Is(serr, cairn.ErrNotFound) {
		t.Fatalf("drain missing = %v", serr)
	}
	// Request counts add up per device and sum across devices.
	for i := 0; i < 3; i++ {
		if aerr := s.AddStoreRequests(ctx, "s3a", "laptop", map[string]int64{"PUT": 2, "GET": 1}); aerr != nil {
			t.Fatal(aerr)
		}
	}
	if aerr := s.AddStoreRequests(ctx, "s3a", "desk", map[string]int64{"GET": 10}); aerr != nil {
		t.Fatal(aerr)
	}
	req, err := s.StoreRequests(ctx, "s3a")
	if err != nil || req["PUT"] != 6 || req["GET"] != 13 {
		t.Fatalf("requests = %v, %v", req, err)
	}
	if err := s.DeleteStore(ctx, "s3a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, "s3a"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("after delete = %v", err)
	}
	if req, _ := s.StoreRequests(ctx, "s3a"); len(req) != 0 {
		t.Fatalf("requests after delete = %v", req)
	}
}
