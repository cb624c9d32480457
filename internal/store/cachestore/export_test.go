package cachestore

// Quiesce waits until the fetches, cache insertions and compactions under
// way have finished, so that a test can look at the cache.
func (s *Store) Quiesce() { s.wg.Wait() }
