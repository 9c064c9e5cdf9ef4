package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

func TestCheckSnapshotPath(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "taken.db")
	require.NoError(t, os.WriteFile(existing, []byte("x"), 0o600))

	for _, tc := range []struct {
		name, path, want string
	}{
		{"a new file", filepath.Join(dir, "etcd.db"), ""},
		{"the file exists", existing, "the file exists: pass a new file name"},
		{"no such directory", filepath.Join(dir, "missing", "etcd.db"), "cannot take a new file"},
		{"a path under a file", filepath.Join(existing, "etcd.db"), "not a directory: pass a file in a writable directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSnapshotPath(tc.path)
			if tc.want == "" {
				require.NoError(t, err)

				left, err := os.ReadDir(dir)
				require.NoError(t, err)
				assert.Len(t, left, 1, "the check leaves nothing behind")

				return
			}

			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "--etcd-snapshot "+tc.path)
			assert.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

// fakeSnapshotter serves snapshots by node IP; a node without one fails.
type fakeSnapshotter struct {
	snapshots map[string][]byte
	asked     []string
}

func (f *fakeSnapshotter) EtcdSnapshot(_ context.Context, node string, w io.Writer) (int64, error) {
	f.asked = append(f.asked, node)

	b, ok := f.snapshots[node]
	if !ok {
		_, _ = w.Write([]byte("partial"))

		return 0, errors.New("rpc error: code = Unavailable desc = connection reset")
	}

	n, err := w.Write(b)

	return int64(n), err
}

func TestSaveEtcdSnapshot(t *testing.T) {
	view := &stages.EtcdView{
		ControlPlanes: []stages.EtcdNode{{Name: "cp-1", IP: "10.0.0.1"}, {Name: "cp-2", IP: "10.0.0.2"}, {Name: "cp-3", IP: "10.0.0.3"}},
		Status: map[string]talos.EtcdStatus{
			"cp-1": {Errors: []string{"memberID:1 alarm:NOSPACE "}},
			"cp-2": {},
			"cp-3": {},
		},
		StatusErr: map[string]error{},
	}
	db := []byte("a bbolt database and its sha256")
	sum := sha256.Sum256(db)

	t.Run("from the first healthy member, the next when it fails", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "etcd.db")
		s := &fakeSnapshotter{snapshots: map[string][]byte{"10.0.0.3": db}}

		saved, err := saveEtcdSnapshot(context.Background(), s, view, path)
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.2", "10.0.0.3"}, s.asked, "cp-1's member has an alarm; cp-2's call broke off")
		assert.Equal(t, savedSnapshot{Node: "cp-3", Size: int64(len(db)), SHA256: hex.EncodeToString(sum[:])}, saved)

		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, db, got)

		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Len(t, left, 1, "no partial file left")
	})

	t.Run("none gives one: no file", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "etcd.db")

		_, err := saveEtcdSnapshot(context.Background(), &fakeSnapshotter{}, view, path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no control plane gave one (cp-2: ")
		assert.Contains(t, err.Error(), "cp-3: ")

		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, left)
	})

	t.Run("no healthy member", func(t *testing.T) {
		_, err := saveEtcdSnapshot(context.Background(), &fakeSnapshotter{}, &stages.EtcdView{ControlPlanes: view.ControlPlanes}, filepath.Join(t.TempDir(), "etcd.db"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no control plane's etcd member is healthy")
	})

	t.Run("a file that appeared meanwhile is kept", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "etcd.db")
		require.NoError(t, os.WriteFile(path, []byte("someone else's"), 0o600))

		_, err := saveEtcdSnapshot(context.Background(), &fakeSnapshotter{snapshots: map[string][]byte{"10.0.0.2": db}}, view, path)
		require.Error(t, err)

		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "someone else's", string(got))
	})
}
