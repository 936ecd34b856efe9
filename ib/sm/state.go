package sm

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"
)

// saveIfDirty writes the state file when the LIDs changed and the last
// write is stateEvery old (now zero: at once). The map is copied under mu
// (O(ports), at most once per stateEvery) and written without it.
func (s *SM) saveIfDirty(now time.Time) {
	s.mu.Lock()
	if !s.stateDirty || (!now.IsZero() && now.Sub(s.stateAt) < stateEvery) {
		s.mu.Unlock()
		return
	}
	s.stateDirty, s.stateAt = false, now
	lids := maps.Clone(s.lids.byGUID)
	s.mu.Unlock()
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if err := writeState(s.cfg.StateFile, lids); err != nil {
		s.logf("state file: %v", err)
	}
}

// stateFile is the JSON of Config.StateFile.
type stateFile struct {
	Version int               `json:"version"`
	LIDs    map[string]uint16 `json:"lids"` // "0x100001" → 2
}

func (s *SM) loadState() error {
	b, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("state file %s: %w", s.cfg.StateFile, err)
	}
	for k, lid := range st.LIDs {
		var guid uint64
		if _, err := fmt.Sscanf(k, "0x%x", &guid); err != nil || !validUnicast(lid) || lid > s.lids.max {
			return fmt.Errorf("state file %s: bad entry %q: %d", s.cfg.StateFile, k, lid)
		}
		s.lids.bind(guid, lid)
	}
	return nil
}

// saveState writes the GUID → LID map now (New). Caller holds mu.
func (s *SM) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	s.stateDirty = false
	return writeState(s.cfg.StateFile, s.lids.byGUID)
}

// writeState writes a GUID → LID map to file (temporary file, then
// rename); no file: nothing.
func writeState(file string, lids map[uint64]uint16) error {
	if file == "" {
		return nil
	}
	st := stateFile{Version: 1, LIDs: make(map[string]uint16, len(lids))}
	for guid, lid := range lids {
		st.LIDs[fmt.Sprintf("%#x", guid)] = lid
	}
	b, err := json.MarshalIndent(&st, "", "  ")
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
