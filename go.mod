module github.com/qpdrain/qpdrain

go 1.26
