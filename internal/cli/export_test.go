package cli

// DecodeQueueRecord is decodeQueueRecord, for FuzzQueueRecord.
func DecodeQueueRecord(b []byte) error {
	rec, err := decodeQueueRecord(b)
	if err != nil {
		return err
	}
	// What decodes must encode and decode to the same record.
	b2, err := encodeQueueRecord(rec)
	if err != nil {
		return err
	}
	rec2, err := decodeQueueRecord(b2)
	if err != nil {
		panic("a decoded queue record does not decode after encoding: " + err.Error())
	}
	if rec2.Path != rec.Path || rec2.Volume != rec.Volume || rec2.Seq != rec.Seq || rec2.Version.Size != rec.Version.Size || rec2.Queued != rec.Queued {
		panic("a queue record changes through encode and decode")
	}
	return nil
}
