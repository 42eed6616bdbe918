module vnpu.io/node/pause

go 1.24
