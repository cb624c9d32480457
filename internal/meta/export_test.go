package meta

// SetTestHookRegister makes Register call f between reading a node's
// record and writing it; the returned function removes it.
func SetTestHookRegister(f func()) func() {
	testHookRegister = f
	return func() { testHookRegister = nil }
}
