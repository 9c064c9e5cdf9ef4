package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// snapshotTimeout bounds the etcd snapshot from one control plane (etcd's
// database is at most 8 GiB).
const snapshotTimeout = 10 * time.Minute

// etcdSnapshotter is the Talos call --etcd-snapshot needs.
type etcdSnapshotter interface {
	// EtcdSnapshot streams a snapshot of etcd taken by a control plane's own
	// member into w and returns its size.
	EtcdSnapshot(ctx context.Context, node string, w io.Writer) (int64, error)
}

// checkSnapshotPath refuses an --etcd-snapshot file that exists (it is never
// overwritten) or whose directory cannot take a new file, before anything
// changes.
func checkSnapshotPath(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("--etcd-snapshot %s: the file exists: pass a new file name (a snapshot never overwrites one)", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--etcd-snapshot %s: %w: pass a file in a writable directory", path, err)
	}

	dir := filepath.Dir(path)

	f, err := os.CreateTemp(dir, ".ichor-etcd-snapshot-check-*")
	if err != nil {
		return fmt.Errorf("--etcd-snapshot %s: directory %s cannot take a new file (%v): pass a file in a writable directory", path, dir, unwrapPathErr(err))
	}

	_ = f.Close()

	return os.Remove(f.Name())
}

// unwrapPathErr is a *fs.PathError's own error (its path is said already).
func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}

	return err
}

// savedSnapshot is an etcd snapshot written to its file.
type savedSnapshot struct {
	Node   string
	Size   int64
	SHA256 string
}

// saveEtcdSnapshot writes an etcd snapshot to path, taken by the first
// control plane whose member etcd said healthy (no error, no alarm, not a
// learner), the next ones if it fails. The file appears complete or not at
// all: written to a temporary file of the same directory, synced, then
// linked to path (which must not exist).
func saveEtcdSnapshot(ctx context.Context, s etcdSnapshotter, view *stages.EtcdView, path string) (savedSnapshot, error) {
	var nodes []stages.EtcdNode

	if view != nil {
		for _, n := range view.ControlPlanes {
			st, ok := view.Status[n.Name]
			if ok && view.StatusErr[n.Name] == nil && len(st.Errors) == 0 && !st.IsLearner {
				nodes = append(nodes, n)
			}
		}
	}

	if len(nodes) == 0 {
		return savedSnapshot{}, errors.New("etcd snapshot: no control plane's etcd member is healthy: see the plan's etcd quorum check")
	}

	var failed []string

	for _, n := range nodes {
		saved, err := writeSnapshot(ctx, s, n, path)
		if err == nil {
			return saved, nil
		}

		if ctx.Err() != nil {
			return savedSnapshot{}, fmt.Errorf("etcd snapshot: %w", ctx.Err())
		}

		failed = append(failed, fmt.Sprintf("%s: %v", n.Name, err))
	}

	return savedSnapshot{}, fmt.Errorf("etcd snapshot: no control plane gave one (%s)", strings.Join(failed, "; "))
}

// writeSnapshot streams node's snapshot into a temporary file beside path,
// then links it to path.
func writeSnapshot(ctx context.Context, s etcdSnapshotter, n stages.EtcdNode, path string) (saved savedSnapshot, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part-*")
	if err != nil {
		return savedSnapshot{}, err
	}

	defer func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}()

	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()

	sum := sha256.New()

	size, err := s.EtcdSnapshot(ctx, n.IP, io.MultiWriter(f, sum))
	if err != nil {
		return savedSnapshot{}, err
	}

	if size == 0 {
		return savedSnapshot{}, errors.New("the snapshot is empty")
	}

	if err := f.Sync(); err != nil {
		return savedSnapshot{}, err
	}

	if err := f.Close(); err != nil {
		return savedSnapshot{}, err
	}

	// A link never replaces a file that appeared meanwhile.
	if err := os.Link(f.Name(), path); err != nil {
		return savedSnapshot{}, fmt.Errorf("save to %s: %w", path, unwrapPathErr(err))
	}

	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}

	return savedSnapshot{Node: n.Name, Size: size, SHA256: hex.EncodeToString(sum.Sum(nil))}, nil
}
