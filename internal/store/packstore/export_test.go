package packstore

// SetRepackHook makes Repack call f after each step ("stored": the new
// packs are stored and indexed; "deleted": one old pack was deleted); an
// error from f stops Repack there, as a crash would.
func (s *Store) SetRepackHook(f func(step string) error) { s.hook = f }

// Abandon drops the store as a crash would: nothing is flushed or saved,
// the index log is closed as it stands (its lock released, as the death of
// the process would release it), background uploads are canceled. The
// backing store is left open.
func (s *Store) Abandon() {
	s.mu.Lock()
	s.closed = true
	if s.disk != nil {
		s.disk.close()
		s.disk = nil
	}
	s.mu.Unlock()
	s.cancel()
}

// Sum256 is the pooled BLAKE3 the store checks objects with.
var Sum256 = sum256
