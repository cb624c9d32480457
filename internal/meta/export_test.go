package meta

// SetTestHookRegister makes Register call f between reading a node's
// record and writing it; the returned function removes it.
func SetTestHookRegister(f func()) func() {
	testHookRegister = f
	return func() { testHookRegister = nil }
}

// EncodeLocalCopyForTest returns a local copy's file holding ents.
func EncodeLocalCopyForTest(vol Volume, rev int64, ents []Entry) []byte {
	f := &LocalCopyFile{Volume: vol, Rev: rev, Saved: 1, Complete: true}
	for _, e := range ents {
		f.Entries = append(f.Entries, storedEntry{Entry: e, R: rev})
	}
	return encodeLocalCopy(f)
}

// WrapLocalCopyBodyForTest returns body behind a local copy's header and
// with its checksum.
func WrapLocalCopyBodyForTest(body []byte) []byte { return wrapLocalCopy(body) }

// SetTestHookACLDecided makes every write call f between its ACL decision
// and its commit; the returned function removes it.
func SetTestHookACLDecided(f func(op, path string)) func() {
	aclDecided = f
	return func() { aclDecided = nil }
}
