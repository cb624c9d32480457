package realm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/volkey"
)

// The realm's devices share one secret, the device key, kept in every
// device's keyring beside the volume keys (under deviceKeyID) and handed to
// a joining device in its sealed payload. Each volume's master key is also
// recorded in the metadata sealed with it (keys/<volID>), so a volume made
// after a device joined reaches that device: it learns the key the first
// time it opens the volume. The metadata service sees only ciphertext;
// benefactors and surrogates never see the device key.
const deviceKeyID = "devices"

// deviceKeyCheckID is where the metadata records which device key the realm
// uses (a keyed check value, not the key), so two devices never make two.
const deviceKeyCheckID = "devices-check"

const sealedKeyFormat = 1

func deviceKeyCheck(dk volkey.Master) string {
	var out [16]byte
	blake3.DeriveKey("cairn v1 device key check", dk[:], out[:])
	return fmt.Sprintf("%x", out)
}

func keyAD(realmID, volID string) []byte {
	return []byte("cairn v1 sealed volume key\x00" + realmID + "\x00" + volID)
}

// sealVolumeKey is format byte 1 || 24-byte nonce || XChaCha20-Poly1305
// (device key, nonce, master key, AD = realm ID and volume ID).
func sealVolumeKey(dk volkey.Master, realmID, volID string, m volkey.Master) []byte {
	aead, _ := chacha20poly1305.NewX(dk[:])
	out := make([]byte, 1+aead.NonceSize(), 1+aead.NonceSize()+len(m)+aead.Overhead())
	out[0] = sealedKeyFormat
	if _, err := rand.Read(out[1:]); err != nil {
		panic(err)
	}
	return aead.Seal(out, out[1:], m[:], keyAD(realmID, volID))
}

func openVolumeKey(dk volkey.Master, realmID, volID string, sealed []byte) (volkey.Master, error) {
	var m volkey.Master
	aead, _ := chacha20poly1305.NewX(dk[:])
	n := 1 + aead.NonceSize()
	if len(sealed) != n+len(m)+aead.Overhead() || sealed[0] != sealedKeyFormat {
		return m, cairn.E("open volume key", cairn.Corrupt, volID, fmt.Errorf("sealed key of %d bytes, not format %d", len(sealed), sealedKeyFormat))
	}
	plain, err := aead.Open(nil, sealed[1:n], sealed[n:], keyAD(realmID, volID))
	if err != nil {
		return m, cairn.E("open volume key", cairn.Permission, volID, errors.New("the recorded key is not sealed with this device's device key"))
	}
	copy(m[:], plain)
	return m, nil
}

// deviceKey returns the realm's device key from the keyring. If this
// device has none and the realm records none, it makes one (the realm's
// first device, or a realm made before device keys), records its check
// value, and publishes every volume key it holds.
func (r *Realm) deviceKey(ctx context.Context) (volkey.Master, error) {
	kr, err := r.Keyring()
	if err != nil {
		return volkey.Master{}, err
	}
	if dk, kerr := kr.Key(deviceKeyID, "realm device key"); kerr == nil {
		// Joined devices got it; the first device made it. Record its
		// check if a crash came between saving and recording it (the
		// record is written once: a different one means another key won).
		perr := r.Meta.PutSealedKey(ctx, deviceKeyCheckID, []byte(deviceKeyCheck(dk)))
		if errors.Is(perr, cairn.ErrExist) {
			return dk, cairn.E("device key", cairn.Permission, r.Home, errors.New("this device's device key is not the realm's: join again with a new invitation"))
		}
		return dk, perr
	}
	if r.Config.User != "" {
		// A device of a user: only the owner's hold the device key.
		if u, uerr := r.Meta.User(ctx, r.Config.User); uerr == nil && !u.Owner {
			return volkey.Master{}, cairn.E("device key", cairn.Permission, r.Config.User, fmt.Errorf("this device belongs to user %s, who does not own the realm: only the owner's devices make volumes and share them", r.Config.User))
		}
	}
	// Saved before it is recorded: a crash in between leaves an unused
	// key here, never a realm that records a key no device holds.
	dk := keyring.NewMaster()
	kr.Add(deviceKeyID, dk)
	if err = kr.Save(); err != nil {
		kr.Remove(deviceKeyID)
		return dk, err
	}
	err = r.Meta.PutSealedKey(ctx, deviceKeyCheckID, []byte(deviceKeyCheck(dk)))
	if err != nil {
		kr.Remove(deviceKeyID)
		if serr := kr.Save(); serr != nil {
			r.log.Warn("drop the unused device key", "err", serr)
		}
		if errors.Is(err, cairn.ErrExist) {
			return dk, cairn.E("device key", cairn.Permission, r.Home, errors.New("this device lacks the realm's device key (it joined before cairn had one): join again with a new invitation"))
		}
		return dk, err
	}
	vols, err := r.Meta.Volumes(ctx)
	if err != nil {
		return dk, err
	}
	for _, v := range vols {
		if m, err := kr.Key(v.ID, v.Name); err == nil {
			if err := r.publishKey(ctx, dk, v.ID, m); err != nil {
				return dk, err
			}
		}
	}
	return dk, nil
}

// publishKey records volume volID's key sealed for the realm's devices
// (already recorded: fine).
func (r *Realm) publishKey(ctx context.Context, dk volkey.Master, volID string, m volkey.Master) error {
	err := r.Meta.PutSealedKey(ctx, volID, sealVolumeKey(dk, r.Config.RealmID, volID, m))
	if errors.Is(err, cairn.ErrExist) {
		return nil
	}
	return err
}

// learnKey fetches a volume's key from the metadata, opens it with the
// device key, checks it against the volume, and keeps it in the keyring.
func (r *Realm) learnKey(ctx context.Context, v *meta.Volume) (volkey.Master, error) {
	kr, err := r.Keyring()
	if err != nil {
		return volkey.Master{}, err
	}
	dk, err := kr.Key(deviceKeyID, "realm device key")
	if err != nil {
		return dk, cairn.E("volume key", cairn.Permission, v.Name, errors.New("this device holds no key for the volume, and no realm device key to learn it with (join again with a new invitation)"))
	}
	sealed, err := r.Meta.SealedKey(ctx, v.ID)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return dk, cairn.E("volume key", cairn.Permission, v.Name, errors.New("this device holds no key for the volume, and the realm records none (the device that made it must run a command once)"))
		}
		return dk, err
	}
	m, err := openVolumeKey(dk, r.Config.RealmID, v.ID, sealed)
	if err != nil {
		return m, err
	}
	if v.KeyCheck != "" && v.KeyCheck != fs.KeyCheck(m) {
		return m, cairn.E("volume key", cairn.Permission, v.Name, errors.New("the recorded key does not open the volume"))
	}
	kr.Add(v.ID, m)
	if err := kr.Save(); err != nil {
		return m, err
	}
	r.log.Info("learned a volume key from the realm", "volume", v.Name)
	return m, nil
}
