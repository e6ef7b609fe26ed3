// tiny_eval/stages: the tiny eval through komputed's gRPC API alone (no kp client), each call
// asking the daemon for its stages' moments (EvalResponse.stages), so that a remote eval's time
// is split into where it went: the request's way to the handler, the daemon's preparation and
// submission, the device and the wait for it, the answer's way back.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace komputed_bench {

// The counters it sets, in microseconds per eval (means).
inline constexpr char kStageRequest[] = "request_us";    // client call -> daemon handler
inline constexpr char kStageQueued[] = "queued_us";      // handler -> its preparation began
inline constexpr char kStagePrepare[] = "prepare_us";    // -> commands and uploads applied
inline constexpr char kStageSubmit[] = "submit_us";      // -> submitted
inline constexpr char kStageDevice[] = "device_us";      // submitted -> completion seen
inline constexpr char kStageAnswer[] = "answer_us";      // completion seen -> answer to gRPC
inline constexpr char kStageResponse[] = "response_us";  // answer to gRPC -> client has it
inline constexpr char kStageInline[] = "inline_share";   // evals waited on the serving thread

// Opens a session of its own on the daemon at `address` (plain text, on this host), makes the
// tiny tensor, algorithm (`tiny_spirv`) and sequence (sync up, dispatch, sync back), then times
// one Eval per iteration: an upload of the whole tensor, and its download, checked.
void RunEvalStages(benchmark::State& state, const std::string& address,
                   const std::vector<uint32_t>& tiny_spirv);

// tiny_eval/same_host_stages: the same eval on the daemon's same-host channel (a session's Unix
// socket, the tensor's host data in shared memory passed to the daemon: no upload or download in
// the messages), as a same-host kp client sends it, polling for the answer for up to `spin` (the
// client's WaitSpin for the device) before it blocks. kStageRequest: the record sent -> the
// daemon's reactor has read it; kStageResponse: the answer sent -> the client has it.
void RunSameHostEvalStages(benchmark::State& state, const std::string& address,
                           const std::vector<uint32_t>& tiny_spirv, absl::Duration spin);

// async_evals/stages: `depth` tiny sequences of one session kept in flight on one Execute stream
// (gRPC's synchronous API: one thread writes each lane's next eval as soon as it has read the
// lane's event), each eval asking for its stages' moments. Sets the counters above (kStageRequest:
// written -> daemon handler; kStageResponse: answer to gRPC -> the event read), means per eval.
void RunAsyncEvalStages(benchmark::State& state, const std::string& address,
                        const std::vector<uint32_t>& tiny_spirv, uint32_t depth);

}  // namespace komputed_bench
