package talosapi

import (
	"crypto/rand"
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// imageService is ImageService on one endpoint: Pull only; a target
// before Talos 1.13 answers Unimplemented (served). A reference no registry
// serves fails NotFound, as Talos' does (machine.Pull).
type imageService struct {
	machineapi.UnimplementedImageServiceServer

	s    *Server
	self *machine.Machine
}

// Pull pulls an image into the CRI or system containerd namespace, streaming
// the layer progress and then the image name.
func (is *imageService) Pull(req *machineapi.ImageServicePullRequest, srv grpc.ServerStreamingServer[machineapi.ImageServicePullResponse]) error {
	t, err := is.s.single(srv.Context(), is.self)
	if err != nil {
		return err
	}
	if err := served(t.m, "machine.ImageService"); err != nil {
		return err
	}
	ns := machine.ContainerdNamespace(req.GetContainerd().GetNamespace())
	if ns == "" {
		return status.Errorf(codes.InvalidArgument, "unsupported containerd namespace %v", req.GetContainerd().GetNamespace())
	}
	name, err := t.m.Pull(srv.Context(), ns, req.GetImageRef())
	if err != nil {
		return err
	}
	if err := srv.Send(&machineapi.ImageServicePullResponse{Response: &machineapi.ImageServicePullResponse_PullProgress{
		PullProgress: &machineapi.ImageServicePullProgress{
			LayerId:  "sha256:simulated",
			Progress: &machineapi.ImageServicePullLayerProgress{Status: machineapi.ImageServicePullLayerProgress_EXTRACT_COMPLETE},
		},
	}}); err != nil {
		return err
	}
	return srv.Send(&machineapi.ImageServicePullResponse{Response: &machineapi.ImageServicePullResponse_Name{Name: name}})
}

// lifecycleService is LifecycleService on one endpoint: Upgrade only; a
// target before Talos 1.13 answers Unimplemented (served).
type lifecycleService struct {
	machineapi.UnimplementedLifecycleServiceServer

	s    *Server
	self *machine.Machine
}

// Upgrade installs the version of the installer image into the other boot
// slot, streaming progress messages then exit code 0; the machine boots it on
// its next reboot. The image must have been pulled into the request's
// namespace (machine.StageUpgrade).
func (ls *lifecycleService) Upgrade(req *machineapi.LifecycleServiceUpgradeRequest, srv grpc.ServerStreamingServer[machineapi.LifecycleServiceUpgradeResponse]) error {
	t, err := ls.s.single(srv.Context(), ls.self)
	if err != nil {
		return err
	}
	if err := served(t.m, "machine.LifecycleService"); err != nil {
		return err
	}
	image := req.GetSource().GetImageName()
	if image == "" {
		return status.Error(codes.InvalidArgument, "source image name is required")
	}
	send := func(p *machineapi.LifecycleServiceInstallProgress) error {
		return srv.Send(&machineapi.LifecycleServiceUpgradeResponse{Progress: p})
	}
	ns := machine.NamespaceSystem
	if c := req.GetContainerd(); c != nil {
		if ns = machine.ContainerdNamespace(c.GetNamespace()); ns == "" {
			return status.Errorf(codes.InvalidArgument, "unsupported containerd namespace %v", c.GetNamespace())
		}
	}
	if err := t.m.StageUpgrade(srv.Context(), ns, image, func(msg string) error {
		return send(&machineapi.LifecycleServiceInstallProgress{Response: &machineapi.LifecycleServiceInstallProgress_Message{Message: msg}})
	}); err != nil {
		return err
	}
	switch f := t.m.Faults(); {
	case f.InstallHangs:
		// Installed; the stream goes quiet until the caller gives up (a
		// runner killed between the install and the reboot).
		<-srv.Context().Done()
		return status.FromContextError(srv.Context().Err()).Err()
	case f.UpgradeUnavailable:
		// Installed; the answer is lost on the way (the node stays up).
		return status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer")
	}
	return send(&machineapi.LifecycleServiceInstallProgress{Response: &machineapi.LifecycleServiceInstallProgress_ExitCode{ExitCode: 0}})
}

// served answers a call to a service the target machine's Talos does not
// have as gRPC does for a service nobody registered (machined before 1.13
// has neither ImageService nor LifecycleService; apid proxies the call to
// it all the same).
func served(m *machine.Machine, service string) error {
	if m.Serves(service) {
		return nil
	}
	return status.Errorf(codes.Unimplemented, "unknown service %s", service)
}

func protoreflectValue(md *common.Metadata) protoreflect.Value {
	return protoreflect.ValueOfMessage(md.ProtoReflect())
}

// newActorID returns a random UUID, as Talos identifies the actor of a
// reboot or upgrade.
func newActorID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
