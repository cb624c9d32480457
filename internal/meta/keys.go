package meta

import (
	"context"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// PutSealedKey records volume volID's master key, sealed by the caller for
// the realm's devices (the metadata service never sees it in the clear), at
// keys/<volID>. It is written once: a second call with other bytes is
// refused (Exist), the same bytes succeed.
func (s *Service) PutSealedKey(ctx context.Context, volID string, sealed []byte) error {
	const op = "record volume key"
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	k := s.key("keys", volID)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(sealed))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return etcdErr(op, volID, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) == string(sealed) {
			return nil
		}
		return cairn.E(op, cairn.Exist, volID, errors.New("the volume's key is already recorded"))
	}
	return nil
}

// SealedKey returns what PutSealedKey recorded for volID (NotFound if
// nothing).
func (s *Service) SealedKey(ctx context.Context, volID string) ([]byte, error) {
	const op = "volume key"
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("keys", volID))
	if err != nil {
		return nil, etcdErr(op, volID, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E(op, cairn.NotFound, volID, errors.New("no key of the volume is recorded for the realm's devices"))
	}
	return resp.Kvs[0].Value, nil
}
