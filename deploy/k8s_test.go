package deploy_test

// k8s/ is checked like docker-compose.yml: every container's
// subcommand, --flags and RAIN_* variables exist in `rain <cmd> -h`, its
// probe paths are routes of the contract, the grace period covers the drain
// and the shutdown, the pods run as non-root on a read-only filesystem with
// resources set and their secrets from files no other user reads, rain
// serve checks user tokens (https key set, audience) and holds client
// addresses to a rate, the shards of RAIN_REDIS parse with rain's own
// parser, and the Service, the PodDisruptionBudget and the
// HorizontalPodAutoscaler select the serving pods the Deployment makes.
//
// k8s-cluster/ is an overlay of k8s/ for a Redis Cluster: rendered as
// kubectl kustomize renders it, it passes the same checks, its one shard a
// cluster, and nothing but that shard differs from k8s/.

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"rain/docs"
	"rain/internal/shard"
)

// k8sObject is the part of a Kubernetes object the test reads.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		// Service
		Ports []struct {
			Name       string `yaml:"name"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		// HPA
		ScaleTargetRef struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas  int `yaml:"minReplicas"`
		MinAvailable int `yaml:"minAvailable"`
	} `yaml:"spec"`
	// serviceSelector is a Service's spec.selector (a plain map, where a
	// Deployment's is matchLabels).
	serviceSelector map[string]string
}

type podSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
		RunAsUser    int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName  string `yaml:"secretName"`
			DefaultMode *int   `yaml:"defaultMode"`
		} `yaml:"secret"`
	} `yaml:"volumes"`
}

type container struct {
	Name    string          `yaml:"name"`
	Image   string          `yaml:"image"`
	Args    []string        `yaml:"args"`
	Ports   []containerPort `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string         `yaml:"name"`
		Value     string         `yaml:"value"`
		ValueFrom map[string]any `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe probe `yaml:"readinessProbe"`
	LivenessProbe  probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Exec struct {
				Command []string `yaml:"command"`
			} `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// readK8s reads the objects of every resource the kustomization lists.
func readK8s(t *testing.T) []k8sObject {
	t.Helper()
	var kust struct {
		Resources []string `yaml:"resources"`
	}
	readYAML(t, "k8s/kustomization.yaml", &kust)
	files, _ := filepath.Glob("k8s/*.yaml")
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(kust.Resources, b) {
			t.Errorf("deploy/k8s/%s is not in the kustomization's resources", b)
		}
	}
	var out []k8sObject
	for _, r := range kust.Resources {
		b, err := os.ReadFile(filepath.Join("k8s", r))
		if err != nil {
			t.Fatalf("kustomization resource %s: %v", r, err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		for {
			var node yaml.Node
			if err := dec.Decode(&node); err != nil {
				break
			}
			var o k8sObject
			var svc struct {
				Spec struct {
					Selector map[string]string `yaml:"selector"`
				} `yaml:"spec"`
			}
			if err := node.Decode(&o); err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			if o.Kind == "Service" {
				if err := node.Decode(&svc); err != nil {
					t.Fatalf("%s: %v", r, err)
				}
				o.serviceSelector = svc.Spec.Selector
			}
			out = append(out, o)
		}
	}
	return out
}

// readOverlay renders the overlay in dir (resources: [../k8s] and
// patches: [- path: FILE], each FILE a strategic merge patch of a
// ConfigMap's data) over base, the objects of k8s/, as kubectl kustomize
// does: a data key patched to a value is set, one patched to null removed.
// Anything else in the overlay fails the test, to be taught here first.
func readOverlay(t *testing.T, dir string, base []k8sObject) []k8sObject {
	t.Helper()
	var kust map[string]any
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &kust)
	for k := range kust {
		if !slices.Contains([]string{"apiVersion", "kind", "resources", "patches"}, k) {
			t.Fatalf("deploy/%s/kustomization.yaml: %s: readOverlay renders resources and patches only; teach it %s", dir, k, k)
		}
	}
	var ov struct {
		Resources []string         `yaml:"resources"`
		Patches   []map[string]any `yaml:"patches"`
	}
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &ov)
	if !slices.Equal(ov.Resources, []string{"../k8s"}) {
		t.Fatalf("deploy/%s: resources %v, want [../k8s]", dir, ov.Resources)
	}
	objs := slices.Clone(base)
	used := []string{"kustomization.yaml"}
	for _, p := range ov.Patches {
		path, ok := p["path"].(string)
		if !ok || len(p) != 1 {
			t.Fatalf("deploy/%s: patch %v: readOverlay renders - path: FILE only", dir, p)
		}
		used = append(used, path)
		var fields map[string]any
		readYAML(t, filepath.Join(dir, path), &fields)
		for k := range fields {
			if !slices.Contains([]string{"apiVersion", "kind", "metadata", "data"}, k) {
				t.Fatalf("deploy/%s/%s: %s: readOverlay patches a ConfigMap's data only", dir, path, k)
			}
		}
		var patch struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Data map[string]*string `yaml:"data"`
		}
		readYAML(t, filepath.Join(dir, path), &patch)
		i := slices.IndexFunc(objs, func(o k8sObject) bool { return o.Kind == patch.Kind && o.Metadata.Name == patch.Metadata.Name })
		if patch.Kind != "ConfigMap" || i < 0 {
			t.Fatalf("deploy/%s/%s patches %s %s: want a ConfigMap of ../k8s", dir, path, patch.Kind, patch.Metadata.Name)
		}
		data := maps.Clone(objs[i].Data)
		for k, v := range patch.Data {
			if v == nil {
				delete(data, k)
			} else {
				data[k] = *v
			}
		}
		objs[i].Data = data
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if !slices.Contains(used, filepath.Base(f)) {
			t.Errorf("deploy/%s/%s is not in the kustomization", dir, filepath.Base(f))
		}
	}
	return objs
}

func TestKubernetes(t *testing.T) {
	checkKubernetes(t, readK8s(t), buildRain(t))
}

func TestKubernetesCluster(t *testing.T) {
	base := readK8s(t)
	objs := readOverlay(t, "k8s-cluster", base)
	checkKubernetes(t, objs, buildRain(t))

	// The one shard is a whole cluster, and the serial counter is on it.
	config := configMaps(objs)["rain"]
	specs, err := shard.ParseSpecs(config["RAIN_REDIS"])
	if err != nil {
		t.Fatalf("RAIN_REDIS: %v", err)
	}
	if _, ok := specs[0].Cluster(); len(specs) != 1 || !ok {
		t.Errorf("RAIN_REDIS=%q: want one shard of the cluster/ (or cluster+tls/) form", config["RAIN_REDIS"])
	}
	if s := config["RAIN_SERIAL_SHARD"]; s != "" && s != specs[0].Name {
		t.Errorf("RAIN_SERIAL_SHARD=%s, want the cluster's shard %s", s, specs[0].Name)
	}
	// Nothing else changed: user auth, rates, probes and all are those of k8s/.
	for i, o := range objs {
		if o.Kind == "ConfigMap" && o.Metadata.Name == "rain" {
			was, now := maps.Clone(base[i].Data), maps.Clone(o.Data)
			for _, k := range []string{"RAIN_REDIS", "RAIN_SERIAL_SHARD"} {
				delete(was, k)
				delete(now, k)
			}
			if !maps.Equal(was, now) {
				t.Errorf("ConfigMap rain: %v, want %v as in deploy/k8s but for the shards", now, was)
			}
			continue
		}
		if !reflect.DeepEqual(o, base[i]) {
			t.Errorf("%s %s differs from deploy/k8s's: the overlay changes the shards only", o.Kind, o.Metadata.Name)
		}
	}
}

// configMaps is the data of each ConfigMap of objs, by name.
func configMaps(objs []k8sObject) map[string]map[string]string {
	config := map[string]map[string]string{}
	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			config[o.Metadata.Name] = o.Data
		}
	}
	return config
}

// checkKubernetes checks the objects of a kustomization as rendered.
func checkKubernetes(t *testing.T, objs []k8sObject, bin string) {
	t.Helper()
	var contract struct {
		Paths map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(docs.OpenAPI, &contract); err != nil {
		t.Fatal(err)
	}
	config := configMaps(objs)
	byKind := map[string][]k8sObject{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	deployments := map[string]k8sObject{}
	for _, d := range byKind["Deployment"] {
		deployments[d.Metadata.Name] = d
		t.Run(d.Metadata.Name, func(t *testing.T) { checkDeployment(t, bin, d, config, contract.Paths) })
	}
	serve, ok := deployments["rain-serve"]
	if !ok {
		t.Fatalf("no rain-serve Deployment (have %v)", keysOf(deployments))
	}
	if _, ok := deployments["rain-settle"]; !ok {
		t.Error("no rain-settle Deployment")
	}
	labels := serve.Spec.Template.Metadata.Labels
	selects := func(sel map[string]string) bool { return mapsEqualSub(sel, labels) }
	for _, want := range []string{"Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"} {
		if len(byKind[want]) == 0 {
			t.Errorf("no %s", want)
		}
	}
	ports := map[string]bool{}
	for _, p := range serve.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	for _, svc := range byKind["Service"] {
		if !selects(svc.serviceSelector) {
			t.Errorf("Service %s selects %v, not rain-serve's pods (%v)", svc.Metadata.Name, svc.serviceSelector, labels)
		}
		for _, p := range svc.Spec.Ports {
			if !ports[p.TargetPort] {
				t.Errorf("Service %s port %s targets %q, which rain-serve's container does not name", svc.Metadata.Name, p.Name, p.TargetPort)
			}
		}
	}
	for _, pdb := range byKind["PodDisruptionBudget"] {
		if !selects(pdb.Spec.Selector.MatchLabels) || pdb.Spec.MinAvailable < 1 {
			t.Errorf("PodDisruptionBudget %s: selects %v, minAvailable %d; want rain-serve's pods, at least 1", pdb.Metadata.Name,
				pdb.Spec.Selector.MatchLabels, pdb.Spec.MinAvailable)
		}
	}
	for _, hpa := range byKind["HorizontalPodAutoscaler"] {
		if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != "rain-serve" || hpa.Spec.MinReplicas < 2 {
			t.Errorf("HorizontalPodAutoscaler %s scales %+v from %d; want the rain-serve Deployment from 2", hpa.Metadata.Name,
				hpa.Spec.ScaleTargetRef, hpa.Spec.MinReplicas)
		}
	}
}

// checkDeployment checks one Deployment of rain.
func checkDeployment(t *testing.T, bin string, d k8sObject, config map[string]map[string]string, routes map[string]any) {
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 {
		t.Fatal("no args: say which rain subcommand it runs")
	}
	sub := c.Args[0]
	h := helpOf(t, bin, sub)
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := h.flags[name]; strings.HasPrefix(a, "-") && !ok {
			t.Errorf("arg %s: rain %s has no such flag", a, sub)
		}
	}
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		m, ok := config[ef.ConfigMapRef.Name]
		if !ok {
			t.Errorf("envFrom ConfigMap %q is not in the kustomization", ef.ConfigMapRef.Name)
		}
		for k, v := range m {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil {
			env[e.Name] = "(from " + strings.Join(keysOf(e.ValueFrom), ",") + ")"
		}
	}
	for k := range env {
		if strings.HasPrefix(k, "RAIN_") && !slices.Contains(h.envs(), k) {
			t.Errorf("env %s: rain %s reads no such variable", k, sub)
		}
	}
	if _, ok := env["RAIN_ADMIN_TOKEN"]; ok {
		t.Error("RAIN_ADMIN_TOKEN in the environment: give it as a file (RAIN_ADMIN_TOKEN_FILE on a secret volume)")
	}
	specs, err := shard.ParseSpecs(env["RAIN_REDIS"])
	if err != nil {
		t.Errorf("RAIN_REDIS=%q: %v", env["RAIN_REDIS"], err)
	}
	if s := env["RAIN_SERIAL_SHARD"]; s != "" && !slices.ContainsFunc(specs, func(sp shard.Spec) bool { return sp.Name == s }) {
		t.Errorf("RAIN_SERIAL_SHARD=%s is not one of RAIN_REDIS's shards", s)
	}
	if f := env["RAIN_ADMIN_TOKEN_FILE"]; f != "" && !mountedSecret(pod, c, f) {
		t.Errorf("RAIN_ADMIN_TOKEN_FILE=%s is on no secret volume", f)
	}
	if sub == "serve" && env["RAIN_ADMIN_TOKEN_FILE"] == "" {
		t.Error("rain serve on --redis needs an admin token: RAIN_ADMIN_TOKEN_FILE on a secret volume")
	}
	if sub == "serve" {
		checkServeGuards(t, env)
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o004 != 0) {
			t.Errorf("secret volume %s: defaultMode %v, want one that other users cannot read (0440, with the pod's fsGroup)", v.Name, v.Secret.DefaultMode)
		}
	}
	for what, p := range map[string]probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		path := p.HTTPGet.Path
		if _, ok := routes[path]; !ok && !(sub == "settle" && path == "/healthz") {
			t.Errorf("%s probe GET %s: not a route of docs/openapi.json", what, path)
		}
		if !slices.ContainsFunc(c.Ports, func(cp containerPort) bool { return cp.Name == p.HTTPGet.Port }) {
			t.Errorf("%s probe on port %q, which the container does not name", what, p.HTTPGet.Port)
		}
	}
	if sub == "serve" {
		// Not /readyz: 503 while any shard is down, on every pod alike.
		if c.ReadinessProbe.HTTPGet.Path != "/readyz/instance" || c.LivenessProbe.HTTPGet.Path != "/livez" {
			t.Errorf("probes %s and %s, want readiness /readyz/instance and liveness /livez", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
		}
		dur := func(k string, def time.Duration) time.Duration {
			if v, ok := env[k]; ok {
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatalf("%s=%q: %v", k, v, err)
				}
				return d
			}
			return def
		}
		drain, shutdown := dur("RAIN_DRAIN_DELAY", 5*time.Second), dur("RAIN_SHUTDOWN_TIMEOUT", 10*time.Second)
		pre := c.Lifecycle.PreStop.Exec.Command
		var preStop time.Duration
		if len(pre) == 2 && pre[0] == "sleep" {
			d, err := time.ParseDuration(pre[1] + "s")
			if err == nil {
				preStop = d
			}
		}
		if preStop < drain {
			t.Errorf("preStop %v sleeps %v, want at least the drain delay %v", pre, preStop, drain)
		}
		if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace < preStop+drain+shutdown {
			t.Errorf("terminationGracePeriodSeconds %v, want at least preStop + drain + shutdown = %v", grace, preStop+drain+shutdown)
		}
	}
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 {
		t.Error("the pod may run as root: want runAsNonRoot and a runAsUser")
	}
	if !c.SecurityContext.ReadOnlyRootFilesystem || c.SecurityContext.AllowPrivilegeEscalation {
		t.Error("want a read-only root filesystem and no privilege escalation")
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if !mapsEqualSub(d.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels) {
		t.Errorf("selector %v does not select the template's labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels)
	}
}

// mountedSecret says whether path is under a mount of a secret volume.
func mountedSecret(pod podSpec, c container, path string) bool {
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return true
			}
		}
	}
	return false
}

// mapsEqualSub says whether every key of sel has its value in labels.
func mapsEqualSub(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// checkServeGuards checks who may grab in production: the app's signed user
// tokens checked against a key set over https with an audience (rain
// serve's shipped default let any client grab as any user_id), and a rate
// per client address.
func checkServeGuards(t *testing.T, env map[string]string) {
	t.Helper()
	ua := env["RAIN_USER_AUTH"]
	switch kind, where, _ := strings.Cut(ua, ":"); {
	case ua == "" || ua == "none":
		t.Errorf("RAIN_USER_AUTH=%q: rain serve must check the app's user tokens in production", ua)
	case kind == "jwks-url" && !strings.HasPrefix(where, "https://"):
		t.Errorf("RAIN_USER_AUTH=%q: a key set over plain http lets anyone on the path sign for any user", ua)
	}
	if env["RAIN_USER_AUTH_AUDIENCE"] == "" {
		t.Error("no RAIN_USER_AUTH_AUDIENCE: a token signed for another app would be taken")
	}
	if r, err := strconv.ParseFloat(env["RAIN_IP_RATE"], 64); err != nil || r <= 0 {
		t.Errorf("RAIN_IP_RATE=%q: want a rate per client address", env["RAIN_IP_RATE"])
	}
}
