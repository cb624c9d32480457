package dav

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"net/http"
	"strings"

	"golang.org/x/net/webdav"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// Dead properties (the ones a client sets with PROPPATCH) live in the
// metadata, as extended attributes of the resource's inode (meta's xattr
// API), so they follow renames, survive a restart of the gateway and are
// the same for every gateway of the realm. doc/format.md, "WebDAV dead
// properties", is the format:
//
//	attribute name  "dav:{" + namespace + "}" + local name
//	                or, when that is longer than meta.MaxXattrName or the
//	                namespace holds a '}', "dav:#" + 32 hex digits of
//	                SHA-256(namespace NUL local name)
//	value           JSON {"ns","name","lang","xml"}: the property's name,
//	                its xml:lang and its inner XML, verbatim
//
// The "dav:" prefix keeps them apart from the user.* attributes of the
// mount; the value names the property, so the attribute name is only an
// index and the hashed form loses nothing.

// PropPrefix starts the name of every attribute that holds a dead property.
const PropPrefix = "dav:"

type propRecord struct {
	Space string `json:"ns"`
	Local string `json:"name"`
	Lang  string `json:"lang,omitempty"`
	XML   string `json:"xml"`
}

// propAttr is the attribute name of property n.
func propAttr(n xml.Name) string {
	k := PropPrefix + "{" + n.Space + "}" + n.Local
	if len(k) <= meta.MaxXattrName && !strings.Contains(n.Space, "}") {
		return k
	}
	sum := sha256.Sum256([]byte(n.Space + "\x00" + n.Local))
	return PropPrefix + "#" + hex.EncodeToString(sum[:16])
}

func encodeProp(p webdav.Property) []byte {
	b, _ := json.Marshal(propRecord{Space: p.XMLName.Space, Local: p.XMLName.Local, Lang: p.Lang, XML: string(p.InnerXML)})
	return b
}

func decodeProp(b []byte) (webdav.Property, error) {
	var r propRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return webdav.Property{}, err
	}
	if r.Local == "" {
		return webdav.Property{}, errors.New("no property name")
	}
	return webdav.Property{XMLName: xml.Name{Space: r.Space, Local: r.Local}, Lang: r.Lang, InnerXML: []byte(r.XML)}, nil
}

// loadProps reads the dead properties of inode ino. A damaged record is
// logged and left out rather than failing every PROPFIND of the resource.
func (f *FS) loadProps(ctx context.Context, ino uint64) (map[xml.Name]webdav.Property, error) {
	attrs, err := f.vol.Meta.Xattrs(ctx, ino)
	if err != nil {
		return nil, err
	}
	out := map[xml.Name]webdav.Property{}
	for k, v := range attrs {
		if !strings.HasPrefix(k, PropPrefix) {
			continue
		}
		p, err := decodeProp(v)
		if err != nil {
			f.log.Warn("ignoring a damaged dead property", "ino", ino, "attribute", k, "err", err)
			continue
		}
		out[p.XMLName] = p
	}
	return out, nil
}

// checkPatch finds the properties a patch cannot store (too large). If
// there are any, nothing is applied: they fail with 507 and every other
// property of the request with 424 (RFC 4918 §9.2: all or nothing).
func checkPatch(patches []webdav.Proppatch) []webdav.Propstat {
	var bad, rest []webdav.Property
	for _, pp := range patches {
		for _, p := range pp.Props {
			if !pp.Remove && len(encodeProp(p)) > meta.MaxXattrValue {
				bad = append(bad, webdav.Property{XMLName: p.XMLName})
			} else {
				rest = append(rest, webdav.Property{XMLName: p.XMLName})
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	out := []webdav.Propstat{{Status: http.StatusInsufficientStorage, Props: bad,
		ResponseDescription: "a property value is larger than 64 KiB"}}
	if len(rest) > 0 {
		out = append(out, webdav.Propstat{Status: webdav.StatusFailedDependency, Props: rest})
	}
	return out
}

// okPatch is the answer to a patch that was applied.
func okPatch(patches []webdav.Proppatch) []webdav.Propstat {
	ps := webdav.Propstat{Status: http.StatusOK}
	for _, pp := range patches {
		for _, p := range pp.Props {
			ps.Props = append(ps.Props, webdav.Property{XMLName: p.XMLName})
		}
	}
	return []webdav.Propstat{ps}
}

// applyPatch sets and removes the properties of inode ino in order. The
// metadata has no transaction across attributes: if one write fails, the
// ones already made are undone (best effort) and the error returned.
func (f *FS) applyPatch(ctx context.Context, ino uint64, patches []webdav.Proppatch) ([]webdav.Propstat, error) {
	if bad := checkPatch(patches); bad != nil {
		return bad, nil
	}
	mv := f.vol.Meta
	type undo struct {
		attr string
		old  []byte // nil: it did not exist
	}
	var done []undo
	rollback := func() {
		for i := len(done) - 1; i >= 0; i-- {
			u := done[i]
			var err error
			if u.old == nil {
				err = mv.RemoveXattr(ctx, ino, u.attr)
				if errors.Is(err, cairn.ErrNotFound) {
					err = nil
				}
			} else {
				err = mv.SetXattr(ctx, ino, u.attr, u.old, meta.XattrAny)
			}
			if err != nil {
				f.log.Error("could not undo part of a failed PROPPATCH", "ino", ino, "attribute", u.attr, "err", err)
			}
		}
	}
	for _, pp := range patches {
		for _, p := range pp.Props {
			attr := propAttr(p.XMLName)
			old, err := mv.Xattr(ctx, ino, attr)
			if errors.Is(err, cairn.ErrNotFound) {
				old, err = nil, nil
			}
			if err != nil {
				rollback()
				return nil, err
			}
			if pp.Remove {
				err = mv.RemoveXattr(ctx, ino, attr)
				if errors.Is(err, cairn.ErrNotFound) {
					err = nil // removing what is not there succeeds (RFC 4918 §14.23)
				}
			} else {
				err = mv.SetXattr(ctx, ino, attr, encodeProp(p), meta.XattrAny)
			}
			if err != nil {
				rollback()
				return nil, err
			}
			if old == nil && pp.Remove {
				continue
			}
			done = append(done, undo{attr, old})
		}
	}
	return okPatch(patches), nil
}

// patchMap applies patches to props in memory (a file not created yet).
func patchMap(props map[xml.Name]webdav.Property, patches []webdav.Proppatch) {
	for _, pp := range patches {
		for _, p := range pp.Props {
			if pp.Remove {
				delete(props, p.XMLName)
			} else {
				props[p.XMLName] = p
			}
		}
	}
}
