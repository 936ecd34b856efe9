package mmsg

// Test hooks for the external tests (package mmsg_test imports rawudp,
// which imports mmsg).

// Serving reports whether Serve runs.
func (r *Reader) Serving() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serve != nil
}

// HandedOver reports whether the socket is back in the netpoller and a
// goroutine that found the read lock held left the socket to its holder.
func (r *Reader) HandedOver() bool { return !r.paused.Load() && r.pending.Load() }
