package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ExecSpec is what the exec-pod helper needs to start one container: it is
// written to a file by the kubelet and read by RunPod in a new mount
// namespace.
type ExecSpec struct {
	// Argv is the command, its first element already resolved to a path on
	// this machine inside the image's root directory.
	Argv       []string `json:"argv"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"workingDir,omitempty"`
	Mounts     []Mount  `json:"mounts"`
	// UID and GID, when set, are the user the command runs as
	// (securityContext.runAsUser/runAsGroup).
	UID *int64 `json:"uid,omitempty"`
	GID *int64 `json:"gid,omitempty"`
	// ReadOnlyRoot makes the root filesystem read-only for the container, as
	// securityContext.readOnlyRootFilesystem does; its volumes stay writable
	// unless mounted read-only.
	ReadOnlyRoot bool `json:"readOnlyRoot,omitempty"`
}

// Mount is a bind mount of Source at Target inside the pod's namespace.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// RunPod is the body of the exec-pod helper: in the private mount namespace
// it was started in, it bind-mounts the pod's volumes and /etc/hosts, then
// replaces itself with the container's command. It returns only on error.
func RunPod(specPath string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec ExecSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("parse %s: %w", specPath, err)
	}
	// Keep the mounts below from propagating to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private (needs root and a new mount namespace): %w", err)
	}
	// Parents before children, as a kubelet mounts them.
	sort.SliceStable(spec.Mounts, func(i, j int) bool {
		return depth(spec.Mounts[i].Target) < depth(spec.Mounts[j].Target)
	})
	// Hold every source open first: a volume mounted over a directory that
	// holds another volume's source (an emptyDir at /tmp, with the cluster's
	// directory under /tmp) must not hide it. The mounts below bind from
	// these descriptors.
	sources := make([]string, len(spec.Mounts))
	for i, m := range spec.Mounts {
		fd, err := syscall.Open(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("volume %s: %w", m.Source, err)
		}
		sources[i] = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	// So is the command: the image's directory may be under a mount too.
	binFD, err := syscall.Open(spec.Argv[0], unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("exec %s: %w", spec.Argv[0], err)
	}
	// Mount points next.
	for _, m := range spec.Mounts {
		if err := mountPoint(m); err != nil {
			return err
		}
	}
	for i, m := range spec.Mounts {
		// A mount point inside an earlier volume is made in that volume.
		if _, err := os.Stat(m.Target); err != nil {
			if err := mountPoint(m); err != nil {
				return err
			}
		}
		if err := syscall.Mount(sources[i], m.Target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := syscall.Mount("", m.Target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("read-only %s: %w", m.Target, err)
			}
		}
	}
	if spec.ReadOnlyRoot {
		// Last, so the volumes (bound from the root mount) keep their own
		// flags: a bind remount changes only this namespace's copy of the
		// root mount, not the mounts on it.
		if err := syscall.Mount("", "/", "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only root filesystem: %w", err)
		}
	}
	if spec.WorkingDir != "" {
		if err := os.Chdir(spec.WorkingDir); err != nil {
			return fmt.Errorf("working dir: %w", err)
		}
	}
	if spec.GID != nil {
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setresgid(int(*spec.GID), int(*spec.GID), int(*spec.GID)); err != nil {
			return fmt.Errorf("run as group %d: %w", *spec.GID, err)
		}
	}
	if spec.UID != nil {
		if err := syscall.Setresuid(int(*spec.UID), int(*spec.UID), int(*spec.UID)); err != nil {
			return fmt.Errorf("run as user %d: %w", *spec.UID, err)
		}
	}
	// An ELF binary runs from a close-on-exec descriptor (fexecve).
	if err := syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", binFD), spec.Argv, spec.Env); err != nil {
		return fmt.Errorf("exec %s as uid %d: %w", spec.Argv[0], os.Getuid(), err)
	}
	return nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// mountPoint makes sure m's target exists: a directory for a directory
// source, an empty file for a file.
func mountPoint(m Mount) error {
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("volume %s: %w", m.Source, err)
	}
	if st.IsDir() {
		err = os.MkdirAll(m.Target, 0o755)
	} else if _, serr := os.Stat(m.Target); serr != nil {
		err = os.MkdirAll(filepath.Dir(m.Target), 0o755)
		if err == nil {
			err = os.WriteFile(m.Target, nil, 0o644)
		}
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", m.Target, err)
	}
	return nil
}

// containerProc is one running container process.
type containerProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	code int
}

// startProcesses materializes the pod's volumes and starts each container as
// a process through the exec-pod helper.
func (r *podRunner) startProcesses(ctx context.Context, pod *corev1.Pod, root string) error {
	dir := filepath.Join(r.k.opts.PodDir, r.uid)
	vols, err := r.materializeVolumes(ctx, pod, filepath.Join(dir, "volumes"))
	if err != nil {
		return err
	}
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte(r.hostsFile(pod)), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(r.k.opts.LogDir, 0o755); err != nil {
		return err
	}
	for _, c := range pod.Spec.Containers {
		argv := append(append([]string{}, c.Command...), c.Args...)
		if len(c.Command) == 0 {
			return fmt.Errorf("container %s: no command: the simulator does not know image %s's entrypoint", c.Name, c.Image)
		}
		bin := filepath.Join(root, argv[0])
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("container %s: exec %s: not found in the image (%s)", c.Name, argv[0], root)
		}
		argv[0] = bin
		env, err := r.env(ctx, pod, c)
		if err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		spec := ExecSpec{Argv: argv, Env: env, WorkingDir: c.WorkingDir, Mounts: []Mount{{Source: hosts, Target: "/etc/hosts", ReadOnly: true}}}
		spec.UID, spec.GID, spec.ReadOnlyRoot = securityOf(pod, c)
		for _, vm := range c.VolumeMounts {
			src, ok := vols[vm.Name]
			if !ok {
				return fmt.Errorf("container %s: volume %s is not supported by the simulator", c.Name, vm.Name)
			}
			if vm.SubPath != "" {
				src = filepath.Join(src, vm.SubPath)
			}
			spec.Mounts = append(spec.Mounts, Mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
		}
		specPath := filepath.Join(dir, c.Name+".json")
		b, _ := json.Marshal(spec)
		if err := os.WriteFile(specPath, b, 0o600); err != nil {
			return err
		}
		logPath := r.logPath(c.Name)
		logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		cmd := exec.Command(r.k.opts.ExecPod[0], append(append([]string{}, r.k.opts.ExecPod[1:]...), "--spec", specPath)...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := cmd.Start(); err != nil {
			_ = logFile.Close()
			return fmt.Errorf("container %s: start: %w", c.Name, err)
		}
		p := &containerProc{name: c.Name, cmd: cmd, done: make(chan struct{})}
		r.mu.Lock()
		r.procs = append(r.procs, p)
		r.mu.Unlock()
		r.logf("container started as a process", "container", c.Name, "pid", cmd.Process.Pid)
		go func() {
			err := cmd.Wait()
			_ = logFile.Close()
			p.code = exitCode(err)
			r.writeUsage(c.Name, cmd.ProcessState)
			close(p.done)
			r.exits <- struct{}{}
		}()
	}
	return nil
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 128
}

func (r *podRunner) logPath(container string) string {
	return filepath.Join(r.k.opts.LogDir, fmt.Sprintf("%s_%s_%s.log", r.ns, r.name, container))
}

// exited reports the first non-zero exit code and whether every container
// process has ended.
func (r *podRunner) exited() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.procs) == 0 {
		return 0, false
	}
	code := 0
	for _, p := range r.procs {
		select {
		case <-p.done:
			if code == 0 {
				code = p.code
			}
		default:
			return 0, false
		}
	}
	return code, true
}

// stopProcesses sends SIGTERM to the pod's processes, SIGKILL after grace,
// and returns the first non-zero exit code.
func (r *podRunner) stopProcesses(grace time.Duration) int {
	r.mu.Lock()
	procs := append([]*containerProc{}, r.procs...)
	r.mu.Unlock()
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.After(grace)
	code := 0
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if code == 0 {
			code = p.code
		}
	}
	r.mu.Lock()
	r.procs = nil
	r.mu.Unlock()
	return code
}

// materializeVolumes writes the pod's volumes to disk and returns their
// directories by volume name. It runs at each start of the pod's containers:
// an emptyDir keeps what the containers wrote before, while a volume from the
// API (Secret, ConfigMap, projected) holds what its source holds now, nothing
// else, as a kubelet's atomic writer leaves it when it mounts the volume again
// for a restarted container (an optional Secret deleted since: empty).
func (r *podRunner) materializeVolumes(ctx context.Context, pod *corev1.Pod, dir string) (map[string]string, error) {
	out := map[string]string{}
	core := r.k.opts.Client.CoreV1()
	for _, v := range pod.Spec.Volumes {
		vdir := filepath.Join(dir, v.Name)
		if v.EmptyDir == nil {
			if err := os.RemoveAll(vdir); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return nil, err
		}
		if v.EmptyDir != nil {
			// As a kubelet makes it: writable by the container's user.
			if err := os.Chmod(vdir, 0o777); err != nil {
				return nil, err
			}
		}
		files := map[string][]byte{}
		switch {
		case v.EmptyDir != nil:
		case v.Secret != nil:
			s, err := core.Secrets(pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && v.Secret.Optional != nil && *v.Secret.Optional:
				// As a kubelet mounts an optional Secret that is not there: empty.
			case err != nil:
				return nil, fmt.Errorf("volume %s: secret %s: %w", v.Name, v.Secret.SecretName, err)
			default:
				addItems(files, s.Data, v.Secret.Items)
			}
		case v.ConfigMap != nil:
			cm, err := core.ConfigMaps(pod.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && v.ConfigMap.Optional != nil && *v.ConfigMap.Optional:
			case err != nil:
				return nil, fmt.Errorf("volume %s: configmap %s: %w", v.Name, v.ConfigMap.Name, err)
			default:
				addItems(files, stringData(cm.Data), v.ConfigMap.Items)
			}
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.ServiceAccountToken != nil:
					exp := int64(3607)
					if src.ServiceAccountToken.ExpirationSeconds != nil {
						exp = *src.ServiceAccountToken.ExpirationSeconds
					}
					req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
						ExpirationSeconds: &exp,
						BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
					}}
					if src.ServiceAccountToken.Audience != "" {
						req.Spec.Audiences = []string{src.ServiceAccountToken.Audience}
					}
					tr, err := core.ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
					if err != nil {
						return nil, fmt.Errorf("volume %s: token for service account %s: %w", v.Name, pod.Spec.ServiceAccountName, err)
					}
					files[src.ServiceAccountToken.Path] = []byte(tr.Status.Token)
				case src.ConfigMap != nil:
					cm, err := core.ConfigMaps(pod.Namespace).Get(ctx, src.ConfigMap.Name, metav1.GetOptions{})
					if err != nil {
						return nil, fmt.Errorf("volume %s: configmap %s: %w", v.Name, src.ConfigMap.Name, err)
					}
					addItems(files, stringData(cm.Data), src.ConfigMap.Items)
				case src.Secret != nil:
					s, err := core.Secrets(pod.Namespace).Get(ctx, src.Secret.Name, metav1.GetOptions{})
					if err != nil {
						return nil, fmt.Errorf("volume %s: secret %s: %w", v.Name, src.Secret.Name, err)
					}
					addItems(files, s.Data, src.Secret.Items)
				case src.DownwardAPI != nil:
					for _, item := range src.DownwardAPI.Items {
						if item.FieldRef != nil {
							val, err := fieldValue(pod, item.FieldRef.FieldPath, r.podIP(pod))
							if err != nil {
								return nil, fmt.Errorf("volume %s: %w", v.Name, err)
							}
							files[item.Path] = []byte(val)
						}
					}
				}
			}
		default:
			continue // not supported: a container that mounts it fails to start with a clear message
		}
		for name, data := range files {
			p := filepath.Join(vdir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return nil, err
			}
		}
		out[v.Name] = vdir
	}
	return out, nil
}

func stringData(m map[string]string) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = []byte(v)
	}
	return out
}

func addItems(files map[string][]byte, data map[string][]byte, items []corev1.KeyToPath) {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = v
		}
		return
	}
	for _, it := range items {
		if v, ok := data[it.Key]; ok {
			files[it.Path] = v
		}
	}
}

func fieldValue(pod *corev1.Pod, path, podIP string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return podIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	}
	if strings.HasPrefix(path, "metadata.labels['") {
		return pod.Labels[strings.TrimSuffix(strings.TrimPrefix(path, "metadata.labels['"), "']")], nil
	}
	return "", fmt.Errorf("field %s is not supported by the simulator", path)
}

// env is the container's environment as a kubelet gives it.
func (r *podRunner) env(ctx context.Context, pod *corev1.Pod, c corev1.Container) ([]string, error) {
	api := r.k.opts.APIServer
	env := map[string]string{
		"PATH": "/usr/local/bin:/usr/bin:/bin",
		// containerd sets HOME from the image's passwd, "/" when it has none.
		"HOME":                          "/",
		"HOSTNAME":                      pod.Name,
		"KUBERNETES_SERVICE_HOST":       api.Addr().String(),
		"KUBERNETES_SERVICE_PORT":       fmt.Sprint(api.Port()),
		"KUBERNETES_SERVICE_PORT_HTTPS": fmt.Sprint(api.Port()),
		"KUBERNETES_PORT":               fmt.Sprintf("tcp://%s", api),
	}
	core := r.k.opts.Client.CoreV1()
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath, r.podIP(pod))
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			s, err := core.Secrets(pod.Namespace).Get(ctx, e.ValueFrom.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = string(s.Data[e.ValueFrom.SecretKeyRef.Key])
		case e.ValueFrom.ConfigMapKeyRef != nil:
			cm, err := core.ConfigMaps(pod.Namespace).Get(ctx, e.ValueFrom.ConfigMapKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out, nil
}

// hostsFile is the pod's /etc/hosts: itself and the in-cluster names.
func (r *podRunner) hostsFile(pod *corev1.Pod) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
	fmt.Fprintf(&b, "%s\t%s\n", r.podIP(pod), pod.Name)
	names := make([]string, 0, len(r.k.opts.Hosts))
	for n := range r.k.opts.Hosts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, addr := range r.k.opts.Hosts[n] {
			fmt.Fprintf(&b, "%s\t%s\n", addr, n)
		}
	}
	return b.String()
}

// securityOf returns the user, group and read-only root of a container, the
// container's securityContext overriding the pod's.
func securityOf(pod *corev1.Pod, c corev1.Container) (uid, gid *int64, readOnlyRoot bool) {
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		readOnlyRoot = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	}
	if uid != nil && gid == nil {
		gid = uid
	}
	return uid, gid, readOnlyRoot
}

// Usage is what a container process used, written beside its log as
// <namespace>_<pod>_<container>.usage.json when it ends (what a kubelet's
// cAdvisor would report): for benchmarks of the product's Job.
type Usage struct {
	Pod         string  `json:"pod"`
	Container   string  `json:"container"`
	ExitCode    int     `json:"exitCode"`
	MaxRSSBytes int64   `json:"maxRSSBytes"`
	UserSeconds float64 `json:"userSeconds"`
	SysSeconds  float64 `json:"sysSeconds"`
	WallSeconds float64 `json:"wallSeconds"`
}

func (r *podRunner) writeUsage(container string, st *os.ProcessState) {
	if st == nil {
		return
	}
	u := Usage{Pod: r.ns + "/" + r.name, Container: container, ExitCode: st.ExitCode(),
		UserSeconds: st.UserTime().Seconds(), SysSeconds: st.SystemTime().Seconds()}
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		u.MaxRSSBytes = ru.Maxrss * 1024 // kilobytes on Linux
	}
	if started, err := os.Stat(filepath.Join(r.k.opts.PodDir, r.uid, container+".json")); err == nil {
		u.WallSeconds = time.Since(started.ModTime()).Seconds()
	}
	b, _ := json.MarshalIndent(u, "", "  ")
	_ = os.WriteFile(strings.TrimSuffix(r.logPath(container), ".log")+".usage.json", b, 0o644)
}
