package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// fakeTalos is the fake cluster's Talos API, by node IP.
type fakeTalos fakeCluster

func (ft *fakeTalos) f() *fakeCluster { return (*fakeCluster)(ft) }

func (ft *fakeTalos) Version(_ context.Context, ip string) (string, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	defer f.mu.Unlock()

	if m.faults.unreachable != 0 {
		if m.faults.unreachable > 0 {
			m.faults.unreachable--
		}

		return "", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp "+ip+":50000: connect: connection refused\"")
	}

	return m.talos, nil
}

func (ft *fakeTalos) MachineConfig(_ context.Context, ip string) (config.Provider, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	defer f.mu.Unlock()

	if f.refuseTalos != nil && f.refuseTalos(m.name, "MachineConfig") {
		return nil, connectionRefused(ip)
	}

	return m.active, nil
}

func (ft *fakeTalos) PersistentMachineConfig(_ context.Context, ip string) (config.Provider, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	defer f.mu.Unlock()

	if f.refuseTalos != nil && f.refuseTalos(m.name, "PersistentMachineConfig") {
		return nil, connectionRefused(ip)
	}

	return m.persistent, nil
}

// connectionRefused is grpc-go's error for a node whose Talos API refuses connections.
func connectionRefused(ip string) error {
	return status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp "+ip+":50000: connect: connection refused\"")
}

func (ft *fakeTalos) Apply(ctx context.Context, ip string, data []byte, dryRun bool) (talos.ApplyResult, error) {
	f := ft.f()
	m := f.machine(ip)

	if _, ok := ctx.Deadline(); !ok {
		return talos.ApplyResult{}, errors.New("fake talos: an apply without its own deadline")
	}

	if err := ctx.Err(); err != nil {
		return talos.ApplyResult{}, err
	}

	f.mu.Lock()
	refused := dryRun && f.refuseTalos != nil && f.refuseTalos(m.name, "Apply (dry run)")
	f.mu.Unlock()

	if refused {
		return talos.ApplyResult{}, connectionRefused(ip)
	}

	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return talos.ApplyResult{}, fmt.Errorf("fake talos: %w", err)
	}

	hash, err := render.Hash(cfg)
	require.NoError(f.t, err)

	call := applyCall{node: m.name, dryRun: dryRun, images: render.Images(cfg), hash: hash, failed: !dryRun && m.faults.applyBlocks}

	f.mu.Lock()
	f.applies = append(f.applies, call)
	f.mu.Unlock()

	if dryRun {
		return talos.ApplyResult{Mode: "NO_REBOOT", Details: "Dry run"}, nil
	}

	if f.beforeApply != nil {
		f.beforeApply(ctx, m)
	}

	if call.failed {
		<-ctx.Done()

		return talos.ApplyResult{}, ctx.Err()
	}

	if n := len(f.cordonedByIchor()); n > f.cordonMax {
		f.mu.Lock()
		f.cordonMax = n
		f.mu.Unlock()
	}

	f.takeConfig(m, cfg)

	return talos.ApplyResult{Mode: "NO_REBOOT", Details: "Applied configuration without a reboot"}, nil
}

func (ft *fakeTalos) PullImage(ctx context.Context, ip string, ns talos.ImageNamespace, ref string) error {
	f := ft.f()
	m := f.machine(ip)

	if f.onPull != nil {
		f.onPull(m.name, ref)
	}

	switch {
	case m.faults.pullUnsup:
		return fmt.Errorf("node %q: pull %s: %w", ip, ref, talos.ErrPullUnsupported)
	case m.faults.pullFails:
		return fmt.Errorf("node %q: pull %s: failed to resolve reference: not found", ip, ref)
	}

	if d := m.faults.pullDelay; d > 0 {
		f.mu.Lock()
		if f.pulling == nil {
			f.pulling = map[string]int{}
		}
		f.pulling[m.name]++
		f.pullingMax = max(f.pullingMax, len(f.pulling))
		f.mu.Unlock()

		defer func() {
			f.mu.Lock()
			if f.pulling[m.name]--; f.pulling[m.name] == 0 {
				delete(f.pulling, m.name)
			}
			f.mu.Unlock()
		}()

		select {
		case <-time.After(d):
		case <-ctx.Done():
			// As the Talos client says a deadline: a gRPC status, not ctx's error.
			return fmt.Errorf("node %q: pull %s: rpc error: code = DeadlineExceeded desc = context deadline exceeded", ip, ref)
		}
	}

	f.mu.Lock()
	f.pulls = append(f.pulls, fmt.Sprintf("%s %s %s", m.name, ns, ref))
	f.mu.Unlock()

	return nil
}

// Manifests renders the kube-proxy manifests from the active config, as a
// control plane does.
func (ft *fakeTalos) Manifests(_ context.Context, ip string) ([]*unstructured.Unstructured, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	image := m.active.K8sProxyConfig().Image()

	if f.staleManifests != 0 {
		image = f.staleImage
		if f.staleManifests > 0 {
			f.staleManifests--
		}
	}
	f.mu.Unlock()

	docs := []string{
		`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"kube-proxy","namespace":"kube-system"}}`,
		fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"kube-proxy","namespace":"kube-system"},`+
			`"spec":{"template":{"spec":{"containers":[{"name":"kube-proxy","image":%q}]}}}}`, image),
		`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"kube-proxy"}}`,
	}

	var out []*unstructured.Unstructured

	for _, d := range docs {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal([]byte(d), &u.Object); err != nil {
			return nil, err
		}

		out = append(out, u)
	}

	return out, nil
}

// The Kubernetes fake has no OS side: the Talos upgrade's tests use fakeOS.

func (ft *fakeTalos) BootID(context.Context, string) (string, error) {
	return "", errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdMembers(context.Context, string) ([]talos.EtcdMember, error) {
	return nil, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdStatus(context.Context, string) (talos.EtcdStatus, error) {
	return talos.EtcdStatus{}, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) {
	return nil, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Install(context.Context, string, string) (bool, error) {
	return false, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Reboot(context.Context, string) error {
	return errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) InstallEvidence(context.Context, string) (talos.Evidence, error) {
	return talos.Evidence{}, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Installed(context.Context, string) (talos.Installed, error) {
	return talos.Installed{}, errors.New("fake talos: no OS side (use fakeOS)")
}
