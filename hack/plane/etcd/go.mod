// Wrapper module: etcd's server module uses replace directives for its
// sibling modules, which `go install` refuses; requiring it here works.
module vnpu.io/plane/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.16
