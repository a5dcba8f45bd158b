#!/usr/bin/env bash
# one device call: CUDA checks of [13] then the glm5_next figures
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/glm5_next_layout.json /tmp/glm5_next_shape > $OUT/glm5_ckpt.txt 2>&1; echo "ckpt done $(date -u +%T)" ) &
w=$!
{
echo "== cuda_conformance"; timeout 150 .bin/test-kernels-cuda-cuda_conformance --test-threads 1 2>&1 | tail -15
echo "== golden_glm5_next_vision cuda"; timeout 150 .bin/test-tests-golden_glm5_next_vision cuda --test-threads 1 2>&1 | tail -40
echo "== golden_glm5_next cuda"; timeout 120 .bin/test-tests-golden_glm5_next cuda --test-threads 1 2>&1 | tail -25
} > $OUT/tests.txt 2>&1
cat $OUT/tests.txt | grep -E "^==|test result|FAILED|failed|panicked|rel err|Error" | head -40
wait $w
GLM_GROUPS="1,64/1024,1024 1/32K 1/128K" GLM_LIMIT_S=${GLM_LIMIT_S:-150} bash benches/gpu/run_glm5_next.sh
tar czf $OUT/kcache.tgz -C $kc .
