// beam_search_kernel.cu: the bookkeeping of one beam search step on the device, so that a whole
// step (model, log-softmax, top-k, this, the cache reorder) can be replayed from a CUDA graph with
// no value crossing to the host.
//
// One thread per sentence, walking its candidates in order exactly as minitorch.beam's reference
// does on the host (same decisions, normalized scores in double precision):
//   - the candidates (values, indices: the best `candidates` of the sentence's [beam * vocab]
//     scores, best first; index = parent beam * vocab + token) are taken until `beam` of them
//     continue: a score <= dead / 2 ends the list, an <eos> among the first `beam` ranks becomes a
//     finished hypothesis, other <eos>s are skipped;
//   - slots no candidate fills keep the sentence's first row with token <eos> and score `dead`;
//   - the sentence is done when its sequence is full (its live beams then finish too), when no
//     candidate continues, or when it holds `beam` finished hypotheses and its best live beam,
//     normalized at this length, ranks no better than the worst of them; the rows of a done
//     sentence get score `dead`;
//   - finished hypotheses are kept sorted by score / length ** length_penalty, best first, a new
//     one after those it ties (the order of a stable sort), at most `beam` of them.
// The step number comes from device memory (a graph replays the same launch at every step); the
// step's parents and tokens go to row `step` of `history`, from which the host rebuilds the
// hypotheses' tokens once decoding has ended.
//
// The launcher follows cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kItem = 4;  // a finished hypothesis: score, step, row, token

__host__ __device__ inline double normalized(float score, int length, double length_penalty) {
  const double n = static_cast<double>(length);
  const double scale = length_penalty == 0.0 ? 1.0 : length_penalty == 1.0 ? n : pow(n, length_penalty);
  return static_cast<double>(score) / scale;
}

__host__ __device__ inline double item_value(const float* item, double length_penalty) {
  return normalized(item[0], static_cast<int>(item[1]) + 1, length_penalty);
}

// Insert (score, step, row, token) into a sentence's sorted hypotheses, keeping the best `beam`.
__host__ __device__ inline void add_finished(float* items, float* count, int beam, double length_penalty, float score, int step,
                             int row, int token) {
  const double value = normalized(score, step + 1, length_penalty);
  const int n = static_cast<int>(*count);
  int pos = 0;
  while (pos < n && item_value(items + pos * kItem, length_penalty) >= value) ++pos;
  if (pos >= beam) return;
  for (int j = n < beam - 1 ? n : beam - 1; j > pos; --j) {
    for (int f = 0; f < kItem; ++f) items[j * kItem + f] = items[(j - 1) * kItem + f];
  }
  float* item = items + pos * kItem;
  item[0] = score;
  item[1] = static_cast<float>(step);
  item[2] = static_cast<float>(row);
  item[3] = static_cast<float>(token);
  *count = static_cast<float>(n < beam ? n + 1 : beam);
}

struct StepArgs {
  const float* values;   // [sentences, candidates]
  const float* indices;  // [sentences, candidates]
  const float* step;     // [1]
  const float* room;     // [sentences]: tokens each sentence may generate
  float* scores;         // [rows]: in, the running scores (already used); out, the next ones
  float* tokens;         // [rows]: the next step's input tokens
  float* sources;        // [rows]: the row each row continues
  float* done;           // [sentences]: 1 once a sentence is done
  float* history;        // [max_steps, 2, rows]: each step's sources and tokens
  float* finished;       // [sentences, beam, kItem]
  float* finished_count; // [sentences]
  int sentences, beam, vocab, candidates, max_steps, eos;
  float dead;
  double length_penalty;
};

// The step of sentence b (a plain function, so that its logic can also be checked on the host).
__host__ __device__ inline void step_sentence(const StepArgs& a, int b) {
  const float step_value = a.step[0];
  if (!(step_value >= 0.f && step_value < static_cast<float>(a.max_steps)) || step_value != floorf(step_value)) return;
  const int step = static_cast<int>(step_value), length = step + 1;
  const int rows = a.sentences * a.beam, base = b * a.beam;
  float* items = a.finished + static_cast<long long>(b) * a.beam * kItem;
  float* count = a.finished_count + b;
  const bool was_done = a.done[b] != 0.f;
  int kept = 0;
  if (!was_done) {
    const float* values = a.values + static_cast<long long>(b) * a.candidates;
    const float* indices = a.indices + static_cast<long long>(b) * a.candidates;
    for (int rank = 0; rank < a.candidates; ++rank) {
      const float score = values[rank];
      if (static_cast<double>(score) <= static_cast<double>(a.dead) / 2) break;
      const int index = static_cast<int>(indices[rank]);
      const int parent = index / a.vocab, token = index - parent * a.vocab;
      if (token == a.eos) {
        if (rank < a.beam) add_finished(items, count, a.beam, a.length_penalty, score, step, base + parent, token);
        continue;
      }
      a.sources[base + kept] = static_cast<float>(base + parent);
      a.tokens[base + kept] = static_cast<float>(token);
      a.scores[base + kept] = score;
      if (++kept == a.beam) break;
    }
  }
  for (int slot = base + kept; slot < base + a.beam; ++slot) {
    a.sources[slot] = static_cast<float>(base);
    a.tokens[slot] = static_cast<float>(a.eos);
    a.scores[slot] = a.dead;
  }
  bool done = was_done;
  if (!was_done) {
    if (static_cast<float>(length) >= a.room[b]) {  // the sequence is full: the live beams end here
      for (int slot = base; slot < base + kept; ++slot) {
        add_finished(items, count, a.beam, a.length_penalty, a.scores[slot], step, static_cast<int>(a.sources[slot]),
                     static_cast<int>(a.tokens[slot]));
      }
      done = true;
    } else if (kept == 0) {
      done = true;
    } else if (static_cast<int>(*count) >= a.beam) {
      done = normalized(a.scores[base], length, a.length_penalty) <=
             item_value(items + (a.beam - 1) * kItem, a.length_penalty);
    }
  }
  if (done) {
    a.done[b] = 1.f;
    for (int slot = base; slot < base + a.beam; ++slot) a.scores[slot] = a.dead;
  }
  float* parents = a.history + static_cast<long long>(step) * 2 * rows;
  float* chosen = parents + rows;
  for (int slot = base; slot < base + a.beam; ++slot) {
    parents[slot] = a.sources[slot];
    chosen[slot] = a.tokens[slot];
  }
}

__global__ void __launch_bounds__(kThreads) beam_search_step_kernel(StepArgs a) {
  const int b = blockIdx.x * kThreads + threadIdx.x;
  if (b < a.sentences) step_sentence(a, b);
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// One step of the bookkeeping above for `sentences` sentences of `beam` rows each; see StepArgs for
// the buffers (contiguous float32; ids and counts held as integral floats). A step number outside
// [0, max_steps) changes nothing.
int launch_beam_search_step(const float* values, const float* indices, const float* step, const float* room,
                            float* scores, float* tokens, float* sources, float* done, float* history,
                            float* finished, float* finished_count, int sentences, int beam, int vocab,
                            int candidates, int max_steps, int eos, float dead, double length_penalty,
                            cudaStream_t stream) {
  MT_RETURN_IF_INVALID(sentences < 0 || beam < 1 || vocab < 1 || candidates < 1 || max_steps < 1 || eos < 0 ||
                       eos >= vocab || length_penalty < 0.0 || static_cast<long long>(beam) * vocab >= (1LL << 24) ||
                       static_cast<long long>(sentences) * beam >= (1LL << 24));
  if (sentences == 0) return 0;
  StepArgs a{values, indices, step, room, scores, tokens, sources, done, history, finished, finished_count,
             sentences, beam, vocab, candidates, max_steps, eos, dead, length_penalty};
  const int blocks = (sentences + kThreads - 1) / kThreads;
  beam_search_step_kernel<<<blocks, kThreads, 0, stream>>>(a);
  return mt_launch_status();
}

}  // extern "C"
