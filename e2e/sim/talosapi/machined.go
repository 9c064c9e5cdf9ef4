package talosapi

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"hash/fnv"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// machineService is MachineService on one endpoint; calls are routed to
// their target machines.
type machineService struct {
	machineapi.UnimplementedMachineServiceServer

	s    *Server
	self *machine.Machine
}

// fanOut runs a unary call on its target machines as apid does: for a
// single target the call's error is the reply's error; for several, every
// machine gets a message and errors are embedded in its metadata.
func fanOut[M proto.Message](ctx context.Context, s *Server, self *machine.Machine, newMsg func() M,
	call func(ctx context.Context, m *machine.Machine) (M, error),
) ([]M, error) {
	ts, multi, err := s.targets(ctx, self)
	if err != nil {
		return nil, err
	}
	one := func(t target) (M, error) {
		if err := s.reachable(t); err != nil {
			var zero M
			return zero, err
		}
		return call(ctx, t.m)
	}
	if !multi {
		msg, err := one(ts[0])
		if err != nil {
			return nil, err
		}
		setMetadata(msg, &common.Metadata{Hostname: ts[0].name})
		return []M{msg}, nil
	}
	out := make([]M, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg, err := one(t)
			md := &common.Metadata{Hostname: t.name}
			if err != nil {
				msg = newMsg()
				st := status.Convert(err)
				md.Error = st.Message()
				md.Status = st.Proto()
			}
			setMetadata(msg, md)
			out[i] = msg
		}()
	}
	wg.Wait()
	return out, nil
}

// setMetadata sets the "metadata" field every Talos reply message has.
func setMetadata(msg proto.Message, md *common.Metadata) {
	r := msg.ProtoReflect()
	if fd := r.Descriptor().Fields().ByName("metadata"); fd != nil {
		r.Set(fd, protoreflectValue(md))
	}
}

// Version returns the running Talos version of the target machine.
func (ms *machineService) Version(ctx context.Context, _ *emptypb.Empty) (*machineapi.VersionResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.Version { return &machineapi.Version{} },
		func(_ context.Context, m *machine.Machine) (*machineapi.Version, error) {
			v, err := m.Version()
			if err != nil {
				return nil, err
			}
			return &machineapi.Version{
				Version: &machineapi.VersionInfo{
					Tag:       v,
					Sha:       "simulated",
					Built:     time.Now().UTC().Format(time.RFC3339),
					GoVersion: goruntime.Version(),
					Os:        "linux",
					Arch:      goruntime.GOARCH,
				},
				Platform: &machineapi.PlatformInfo{Name: "metal", Mode: "metal"},
				Features: &machineapi.FeaturesInfo{Rbac: true},
			}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.VersionResponse{Messages: msgs}, nil
}

// ApplyConfiguration applies a machine config (see machine.ApplyConfiguration).
func (ms *machineService) ApplyConfiguration(ctx context.Context, req *machineapi.ApplyConfigurationRequest) (*machineapi.ApplyConfigurationResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ApplyConfiguration { return &machineapi.ApplyConfiguration{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.ApplyConfiguration, error) {
			return m.ApplyConfiguration(ctx, req)
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ApplyConfigurationResponse{Messages: msgs}, nil
}

// ImagePull pulls an image (the older MachineService call).
func (ms *machineService) ImagePull(ctx context.Context, req *machineapi.ImagePullRequest) (*machineapi.ImagePullResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ImagePull { return &machineapi.ImagePull{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.ImagePull, error) {
			ns := machine.ContainerdNamespace(req.GetNamespace())
			if ns == "" {
				return nil, status.Errorf(codes.InvalidArgument, "unsupported containerd namespace %v", req.GetNamespace())
			}
			if _, err := m.Pull(ctx, ns, req.GetReference()); err != nil {
				return nil, err
			}
			return &machineapi.ImagePull{}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ImagePullResponse{Messages: msgs}, nil
}

// EtcdMemberList lists the etcd members: every control-plane machine that
// has joined (booted at least once: one powered off since `up` is not a
// member yet), as a voter, whether its etcd runs or not (a stopped or
// powered-off member stays listed).
// Workers run no etcd. Asked of the machine's own etcd (query_local) while
// it is stopped, it waits for the caller's deadline as Talos' etcd client
// does.
func (ms *machineService) EtcdMemberList(ctx context.Context, req *machineapi.EtcdMemberListRequest) (*machineapi.EtcdMemberListResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.EtcdMembers { return &machineapi.EtcdMembers{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.EtcdMembers, error) {
			if _, err := m.Version(); err != nil {
				return nil, err
			}
			if !m.ControlPlane() {
				return nil, status.Error(codes.FailedPrecondition, "etcd is not running on this node: it is not a control plane node")
			}
			if req.GetQueryLocal() && m.EtcdStopped() {
				return nil, waitStoppedEtcd(ctx, "")
			}
			var members []*machineapi.EtcdMember
			for _, cp := range ms.s.machines {
				if !cp.EtcdMember() {
					continue
				}
				ip := cp.IP().String()
				members = append(members, &machineapi.EtcdMember{
					Id:         memberID(cp.Name()),
					Hostname:   cp.Name(),
					PeerUrls:   []string{"https://" + ip + ":2380"},
					ClientUrls: []string{"https://" + ip + ":2379"},
				})
			}
			return &machineapi.EtcdMembers{Members: members}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.EtcdMemberListResponse{Messages: msgs}, nil
}

func memberID(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// Upgrade is MachineService.Upgrade (see machine.Upgrade): its checks in the
// call, then an ack while the upgrade sequence (drain, install, reboot) runs
// in the background. A control plane's call runs Talos' etcd checks. Under
// the upgradeUnavailable fault the sequence starts and the ack is lost on
// the way: the call answers Unavailable (a connection reset), the node
// still up; it installs and reboots by itself.
func (ms *machineService) Upgrade(ctx context.Context, req *machineapi.UpgradeRequest) (*machineapi.UpgradeResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.Upgrade { return &machineapi.Upgrade{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.Upgrade, error) {
			actor := newActorID()
			if err := m.Upgrade(machine.WithActorID(ctx, actor), req, ms.s.etcdValidateForUpgrade); err != nil {
				return nil, err
			}
			if m.Faults().UpgradeUnavailable {
				return nil, status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer")
			}
			return &machineapi.Upgrade{Ack: "Upgrade request received", ActorId: actor}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.UpgradeResponse{Messages: msgs}, nil
}

// Reboot reboots the target machine (the reply comes before it goes down),
// answering with the actor ID its sequence's runtime events carry.
func (ms *machineService) Reboot(ctx context.Context, _ *machineapi.RebootRequest) (*machineapi.RebootResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.Reboot { return &machineapi.Reboot{} },
		func(_ context.Context, m *machine.Machine) (*machineapi.Reboot, error) {
			actor := newActorID()
			if err := m.RebootBy(actor); err != nil {
				return nil, err
			}
			return &machineapi.Reboot{ActorId: actor}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.RebootResponse{Messages: msgs}, nil
}

// Rollback makes the other boot slot the default again and reboots the
// target machine into it (see machine.Rollback), answering before it goes
// down.
func (ms *machineService) Rollback(ctx context.Context, _ *machineapi.RollbackRequest) (*machineapi.RollbackResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.Rollback { return &machineapi.Rollback{} },
		func(_ context.Context, m *machine.Machine) (*machineapi.Rollback, error) {
			if err := m.Rollback(); err != nil {
				return nil, err
			}
			return &machineapi.Rollback{}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.RollbackResponse{Messages: msgs}, nil
}

// Kubeconfig streams a tar.gz holding the admin kubeconfig (control planes).
func (ms *machineService) Kubeconfig(_ *emptypb.Empty, srv grpc.ServerStreamingServer[common.Data]) error {
	t, err := ms.s.single(srv.Context(), ms.self)
	if err != nil {
		return err
	}
	kubeconfig, err := t.m.Kubeconfig()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "kubeconfig", Mode: 0o600, Size: int64(len(kubeconfig)), ModTime: time.Now()}); err != nil {
		return fmt.Errorf("kubeconfig archive: %w", err)
	}
	if _, err := tw.Write(kubeconfig); err != nil {
		return fmt.Errorf("kubeconfig archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("kubeconfig archive: %w", err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("kubeconfig archive: %w", err)
	}
	return srv.Send(&common.Data{Bytes: buf.Bytes()})
}

// Read streams a file of the target machine (only the boot ID and hostname
// exist).
func (ms *machineService) Read(req *machineapi.ReadRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	t, err := ms.s.single(srv.Context(), ms.self)
	if err != nil {
		return err
	}
	b, err := t.m.ReadFile(req.GetPath())
	if err != nil {
		return err
	}
	return srv.Send(&common.Data{Bytes: b})
}

// Logs streams a service's log from the system namespace; only machined's
// is kept (its log of the current boot: the lifecycle service's installs).
// Follow is not served. Under the logSlow fault the log comes only after that
// long (a node under load, a slow link to it), or not at all if the caller
// gives up first.
func (ms *machineService) Logs(req *machineapi.LogsRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	t, err := ms.s.single(srv.Context(), ms.self)
	if err != nil {
		return err
	}
	if req.GetNamespace() != "system" || req.GetId() != "machined" {
		return status.Errorf(codes.NotFound, "log %q not found", req.GetId())
	}
	if req.GetFollow() {
		return status.Error(codes.Unimplemented, "the simulated machined does not follow logs")
	}
	if d := t.m.Faults().LogSlow.Duration; d > 0 {
		select {
		case <-time.After(d):
		case <-srv.Context().Done():
			return status.FromContextError(srv.Context().Err()).Err()
		}
	}
	b, err := t.m.MachinedLog()
	if err != nil {
		return err
	}
	if n := int(req.GetTailLines()); n >= 0 {
		lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
		if n < len(lines) {
			lines = lines[len(lines)-n:]
		}
		b = []byte(strings.Join(lines, "") + "\n")
	}
	return srv.Send(&common.Data{Bytes: b})
}
