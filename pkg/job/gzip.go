package job

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
)

// maxUnzipped bounds what a gzipped value of the state or the history may
// unpack to (a corrupted or hostile value must not exhaust the memory).
const maxUnzipped = 64 << 20

// gzipJSON returns v as gzipped JSON.
func gzipJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}

	return gzipBytes(b)
}

// gzipBytes returns b gzipped.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer

	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}

	if err := zw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// gunzip returns what blob holds, at most maxUnzipped bytes.
func gunzip(blob []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}

	raw, err := io.ReadAll(io.LimitReader(zr, maxUnzipped+1))
	if err != nil {
		return nil, err
	}

	if len(raw) > maxUnzipped {
		return nil, fmt.Errorf("unpacks to more than %d MiB", maxUnzipped>>20)
	}

	return raw, nil
}
